// The decode engine's kernels: a small-batch GEMM on torch Linear weights (out, in) and
// paged single-head attention, each in an AVX2+FMA build and a portable build chosen at run
// time. No global -march flag: the AVX2 functions carry target attributes, so the library
// still runs on CPUs without AVX2 (and builds on non-x86 hosts, where only the portable
// build exists).
#include "kernels.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HYFLOW_DECODE_X86 1
#endif

namespace hyflow::models::decode {
namespace {

constexpr int kTileRows = 4;       // weight rows per register tile
constexpr int kTileCols = 3;       // activation rows per register tile
constexpr int64_t kRowBlock = 48;  // activation rows per pass over a weight tile (L1/L2 resident)

std::atomic<bool> g_force_portable{false};

// ---- portable build --------------------------------------------------------------------
// Eight independent lanes per accumulator, so compilers vectorize with the baseline ISA.
template <int R, int C>
void tile_portable(const float* x, int64_t ldx, const float* w, int64_t in, float* dots) {
  float acc[R][C][8] = {};
  int64_t k = 0;
  for (; k + 8 <= in; k += 8) {
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        for (int l = 0; l < 8; ++l) acc[r][c][l] += w[r * in + k + l] * x[c * ldx + k + l];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float s = ((acc[r][c][0] + acc[r][c][4]) + (acc[r][c][1] + acc[r][c][5])) +
                ((acc[r][c][2] + acc[r][c][6]) + (acc[r][c][3] + acc[r][c][7]));
      for (int64_t kk = k; kk < in; ++kk) s += w[r * in + kk] * x[c * ldx + kk];
      dots[r * C + c] = s;
    }
  }
}

float dot_portable(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[k + l] * b[k + l];
  }
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

void axpy_portable(float* y, float a, const float* x, int64_t n) {
  for (int64_t k = 0; k < n; ++k) y[k] += a * x[k];
}

// ---- AVX2 + FMA build ------------------------------------------------------------------
#ifdef HYFLOW_DECODE_X86
__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// pf: the next weight tile (R rows of `in`), fetched into the cache while this one computes, so
// the memory stays busy during the activation tiles that reuse a weight tile from L1.
template <int R, int C>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, int64_t ldx, const float* w, int64_t in, float* dots,
                                                   const float* pf) {
  __m256 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 <= in; k += 8) {
    if (pf != nullptr) {
      // two cache lines per iteration: all R rows of the next tile over the loop (R = 4)
      const int64_t line = (k / 8) * 2;
      const int64_t row = line % R, col = (line / R) * 16;
      _mm_prefetch(reinterpret_cast<const char*>(pf + row * in + col), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(pf + ((line + 1) % R) * in + ((line + 1) / R) * 16), _MM_HINT_T0);
    }
    __m256 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w + r * in + k);
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) {
      const __m256 xv = _mm256_loadu_ps(x + c * ldx + k);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t kk = k; kk < in; ++kk) s += w[r * in + kk] * x[c * ldx + kk];
      dots[r * C + c] = s;
    }
  }
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
  }
  for (; k + 8 <= n; k += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float* y, float a, const float* x, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    _mm256_storeu_ps(y + k, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + k), _mm256_loadu_ps(y + k)));
  }
  for (; k < n; ++k) y[k] += a * x[k];
}

// exp(x) for 8 floats: Cody-Waite range reduction by ln 2 and a degree-5 polynomial (the
// Cephes expf scheme, within 2 ulp of the correctly rounded value for |x| < 88).
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3F)), _mm256_set1_ps(88.3F));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341F), _mm256_set1_ps(0.5F)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375F), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4F), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4F);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3F));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3F));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2F));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1F));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1F));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0F)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// scores[s] = exp(scores[s] - max) for s < n; returns their sum (in the lane order, then the tail).
__attribute__((target("avx2,fma"))) float exp_shift_avx2(float* scores, int64_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  __m256 total = _mm256_setzero_ps();
  int64_t s = 0;
  for (; s + 8 <= n; s += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + s), m));
    _mm256_storeu_ps(scores + s, e);
    total = _mm256_add_ps(total, e);
  }
  float sum = hsum(total);
  for (; s < n; ++s) {
    scores[s] = std::exp(scores[s] - max);
    sum += scores[s];
  }
  return sum;
}

__attribute__((target("avx2,fma"))) void silu_mul_avx2(float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0F);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.0F + std::exp(-gate[i])) * up[i];
}

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}
#else
bool cpu_has_avx2() {
  return false;
}
#endif

bool use_avx2() {
  return cpu_has_avx2() && !g_force_portable.load(std::memory_order_relaxed);
}

// Dots of weight rows [o, o + nr) with activation rows [m, m + nc), nr in {4, 1..3 as 1s}.
template <bool Avx2>
void tile(const float* x, int64_t ldx, int nc, const float* w, int64_t in, float* dots, const float* pf) {
  auto run = [&]<int R, int C>() {
#ifdef HYFLOW_DECODE_X86
    if constexpr (Avx2) return tile_avx2<R, C>(x, ldx, w, in, dots, pf);
#endif
    tile_portable<R, C>(x, ldx, w, in, dots);
  };
  if (nc == 3) {
    run.template operator()<kTileRows, 3>();
  } else if (nc == 2) {
    run.template operator()<kTileRows, 2>();
  } else {
    run.template operator()<kTileRows, 1>();
  }
}

template <bool Avx2>
void tile_one_row(const float* x, int64_t ldx, int nc, const float* w, int64_t in, float* dots) {
  auto run = [&]<int C>() {
#ifdef HYFLOW_DECODE_X86
    if constexpr (Avx2) return tile_avx2<1, C>(x, ldx, w, in, dots, nullptr);
#endif
    tile_portable<1, C>(x, ldx, w, in, dots);
  };
  if (nc == 3) {
    run.template operator()<3>();
  } else if (nc == 2) {
    run.template operator()<2>();
  } else {
    run.template operator()<1>();
  }
}

template <bool Avx2>
void linear_impl(const float* x, int64_t ldx, int64_t rows, const float* w, const float* bias, int64_t in, int64_t out,
                 float* y, int64_t ldy, bool accumulate) {
  const int64_t tiles = (out + kTileRows - 1) / kTileRows;
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, in));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    float dots[kTileRows * kTileCols];
    for (int64_t m0 = 0; m0 < rows; m0 += kRowBlock) {
      const int64_t m1 = std::min(rows, m0 + kRowBlock);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t o = t * kTileRows;
        const int nr = static_cast<int>(std::min<int64_t>(kTileRows, out - o));
        for (int64_t m = m0; m < m1; m += kTileCols) {
          const int nc = static_cast<int>(std::min<int64_t>(kTileCols, m1 - m));
          const float* xm = x + m * ldx;
          if (nr == kTileRows) {
            const float* pf = o + 2 * kTileRows <= out ? w + (o + kTileRows) * in : nullptr;
            tile<Avx2>(xm, ldx, nc, w + o * in, in, dots, pf);
            for (int r = 0; r < nr; ++r) {
              for (int c = 0; c < nc; ++c) {
                const float v = bias != nullptr ? dots[r * nc + c] + bias[o + r] : dots[r * nc + c];
                float& dst = y[(m + c) * ldy + o + r];
                dst = accumulate ? dst + v : v;
              }
            }
          } else {
            for (int r = 0; r < nr; ++r) {
              tile_one_row<Avx2>(xm, ldx, nc, w + (o + r) * in, in, dots);
              for (int c = 0; c < nc; ++c) {
                const float v = bias != nullptr ? dots[c] + bias[o + r] : dots[c];
                float& dst = y[(m + c) * ldy + o + r];
                dst = accumulate ? dst + v : v;
              }
            }
          }
        }
      }
    }
  });
}

template <bool Avx2>
void attend_impl(const float* q, const float* k, const float* v, const int32_t* blocks, int64_t block_size,
                 int64_t stride, int64_t length, int64_t dim, float* scores, float* out) {
  auto dot = [&](const float* a, const float* b) {
#ifdef HYFLOW_DECODE_X86
    if constexpr (Avx2) return dot_avx2(a, b, dim);
#endif
    return dot_portable(a, b, dim);
  };
  auto axpy = [&](float a, const float* xs) {
#ifdef HYFLOW_DECODE_X86
    if constexpr (Avx2) return axpy_avx2(out, a, xs, dim);
#endif
    axpy_portable(out, a, xs, dim);
  };
  auto offset = [&](int64_t s) {
    return (static_cast<int64_t>(blocks[s / block_size]) * block_size + s % block_size) * stride;
  };
  const float scale = std::sqrt(static_cast<float>(dim));
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < length; ++s) {
    scores[s] = dot(q, k + offset(s)) / scale;
    max_score = std::max(max_score, scores[s]);
  }
  float total = 0.0F;
  bool exponentiated = false;
#ifdef HYFLOW_DECODE_X86
  if constexpr (Avx2) {
    total = exp_shift_avx2(scores, length, max_score);
    exponentiated = true;
  }
#endif
  if (!exponentiated) {
    for (int64_t s = 0; s < length; ++s) {
      scores[s] = std::exp(scores[s] - max_score);
      total += scores[s];
    }
  }
  std::fill(out, out + dim, 0.0F);
  for (int64_t s = 0; s < length; ++s) axpy(scores[s] / total, v + offset(s));
}

}  // namespace

bool avx2_kernels() {
  return use_avx2();
}

void force_portable_kernels(bool on) {
  g_force_portable.store(on);
}

void linear(const float* x, int64_t ldx, int64_t rows, const float* w, const float* bias, int64_t in, int64_t out,
            float* y, int64_t ldy, bool accumulate) {
  if (rows <= 0 || out <= 0) return;
  if (use_avx2()) {
    linear_impl<true>(x, ldx, rows, w, bias, in, out, y, ldy, accumulate);
  } else {
    linear_impl<false>(x, ldx, rows, w, bias, in, out, y, ldy, accumulate);
  }
}

void attend(const float* q, const float* k, const float* v, const int32_t* blocks, int64_t block_size, int64_t stride,
            int64_t length, int64_t dim, float* scores, float* out) {
  if (use_avx2()) {
    attend_impl<true>(q, k, v, blocks, block_size, stride, length, dim, scores, out);
  } else {
    attend_impl<false>(q, k, v, blocks, block_size, stride, length, dim, scores, out);
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
#ifdef HYFLOW_DECODE_X86
  if (use_avx2()) return silu_mul_avx2(gate, up, n);
#endif
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0F + std::exp(-gate[i])) * up[i];
}

double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace hyflow::models::decode
