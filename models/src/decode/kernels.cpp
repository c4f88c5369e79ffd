// The decode engine's kernels: a small-batch GEMM on packed weights (panels of 16 output
// columns, k-major) with a broadcast register tile, and paged single-head attention, in
// AVX-512 (GEMM only), AVX2+FMA and portable builds chosen at run time. No global -march flag:
// the vector functions carry target attributes, so the library still runs on CPUs without
// AVX2 (and builds on non-x86 hosts, where only the portable build exists).
#include "kernels.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HYFLOW_DECODE_X86 1
#endif

namespace hyflow::models::decode {
namespace {

std::atomic<int> g_isa_limit{static_cast<int>(Isa::kAvx512)};

// Every output of the GEMM is one chain acc = x[k] * w[k] + acc over k = 0, 1, ..., in - 1
// from acc = 0, whatever the build, the tile shape or the number of rows: the register tile
// only decides which outputs advance side by side. The vector builds round once per step
// (FMA), so they agree bit for bit; the portable build rounds the product and the sum apart
// unless the target has a fast fma (FP_FAST_FMAF), where it uses std::fma and agrees too.
constexpr int kMaxTileRows = 8;
constexpr int kMaxTilePanels = 3;

// A register tile: M activation rows times NP panels (NP * 16 outputs), over all of k. p: the
// first panel (k-major, 16 floats per k), the others follow at stride in * 16; out: M rows of
// NP * 16 sums. next, lines: cache lines to fetch while the tile computes, one per k step (and a
// second past `in` steps): the next group's panels, so that they come from memory while this
// group's row tiles run (tiles of one group after the first read its panels from the cache).
using TileFn = void (*)(const float* x, int64_t ldx, const float* p, int64_t in, float* out, const char* next,
                        int64_t lines);

// ---- portable build --------------------------------------------------------------------
template <int M, int NP>
void tile_portable(const float* x, int64_t ldx, const float* p, int64_t in, float* out) {  // fetches nothing ahead
  constexpr int W = NP * kPanel;
  float acc[M][W] = {};
  const int64_t stride = in * kPanel;
  for (int64_t k = 0; k < in; ++k) {
    for (int m = 0; m < M; ++m) {
      const float xv = x[m * ldx + k];
      for (int n = 0; n < NP; ++n) {
        const float* w = p + n * stride + k * kPanel;
        for (int j = 0; j < kPanel; ++j) {
#ifdef FP_FAST_FMAF
          acc[m][n * kPanel + j] = std::fma(xv, w[j], acc[m][n * kPanel + j]);
#else
          acc[m][n * kPanel + j] += xv * w[j];
#endif
        }
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    for (int j = 0; j < W; ++j) out[m * W + j] = acc[m][j];
  }
}

// ---- portable build --------------------------------------------------------------------
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

// ---- AVX2 + FMA build ------------------------------------------------------------------
#ifdef HYFLOW_DECODE_X86
__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Two cache lines per panel ahead of the k being read: the panels are read once per pass from
// memory, as streams the hardware prefetcher sees late at the start of each tile.
constexpr int64_t kPrefetchAhead = 32;  // k steps (2 KiB per panel)

// Step k of a tile's share of the next group's lines (TileFn).
inline void fetch_next(const char* next, int64_t lines, int64_t k, int64_t in) {
  if (k < lines) _mm_prefetch(next + k * 64, _MM_HINT_T0);
  if (k + in < lines) _mm_prefetch(next + (k + in) * 64, _MM_HINT_T0);
}

// Two ymm (16 outputs) per panel: M * NP * 2 accumulators (at most 12 of the 16 registers).
template <int M, int NP>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, int64_t ldx, const float* p, int64_t in,
                                                   float* out, const char* next, int64_t lines) {
  __m256 acc[M][NP][2];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
    for (int n = 0; n < NP; ++n) acc[m][n][0] = acc[m][n][1] = _mm256_setzero_ps();
  }
  const int64_t stride = in * kPanel;
#pragma GCC unroll 2
  for (int64_t k = 0; k < in; ++k) {
    __m256 w[NP][2];
#pragma GCC unroll 4
    for (int n = 0; n < NP; ++n) {
      const float* pk = p + n * stride + k * kPanel;
      _mm_prefetch(reinterpret_cast<const char*>(pk + kPrefetchAhead * kPanel), _MM_HINT_T0);
      w[n][0] = _mm256_loadu_ps(pk);
      w[n][1] = _mm256_loadu_ps(pk + 8);
    }
    fetch_next(next, lines, k, in);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m256 xv = _mm256_broadcast_ss(x + m * ldx + k);
#pragma GCC unroll 4
      for (int n = 0; n < NP; ++n) {
        acc[m][n][0] = _mm256_fmadd_ps(xv, w[n][0], acc[m][n][0]);
        acc[m][n][1] = _mm256_fmadd_ps(xv, w[n][1], acc[m][n][1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
    for (int n = 0; n < NP; ++n) {
      _mm256_storeu_ps(out + (m * NP + n) * kPanel, acc[m][n][0]);
      _mm256_storeu_ps(out + (m * NP + n) * kPanel + 8, acc[m][n][1]);
    }
  }
}

// One zmm (16 outputs) per panel: M * NP accumulators (at most 24 of the 32 registers).
template <int M, int NP>
__attribute__((target("avx512f"))) void tile_avx512(const float* x, int64_t ldx, const float* p, int64_t in,
                                                    float* out, const char* next, int64_t lines) {
  __m512 acc[M][NP];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
    for (int n = 0; n < NP; ++n) acc[m][n] = _mm512_setzero_ps();
  }
  const int64_t stride = in * kPanel;
#pragma GCC unroll 2
  for (int64_t k = 0; k < in; ++k) {
    __m512 w[NP];
#pragma GCC unroll 4
    for (int n = 0; n < NP; ++n) {
      const float* pk = p + n * stride + k * kPanel;
      _mm_prefetch(reinterpret_cast<const char*>(pk + kPrefetchAhead * kPanel), _MM_HINT_T0);
      w[n] = _mm512_loadu_ps(pk);
    }
    fetch_next(next, lines, k, in);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_set1_ps(x[m * ldx + k]);
#pragma GCC unroll 4
      for (int n = 0; n < NP; ++n) acc[m][n] = _mm512_fmadd_ps(xv, w[n], acc[m][n]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
    for (int n = 0; n < NP; ++n) _mm512_storeu_ps(out + (m * NP + n) * kPanel, acc[m][n]);
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

Isa cpu_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return Isa::kPortable;
    return __builtin_cpu_supports("avx512f") ? Isa::kAvx512 : Isa::kAvx2;
  }();
  return isa;
}
#else
Isa cpu_isa() {
  return Isa::kPortable;
}
#endif

Isa current_isa() {
  return static_cast<Isa>(std::min(static_cast<int>(cpu_isa()), g_isa_limit.load(std::memory_order_relaxed)));
}

bool use_avx2() {
  return current_isa() >= Isa::kAvx2;
}

// The tile shapes of a build: up to `rows` activation rows per tile; a tile of m rows covers
// panels(m) panels; the output is split into groups of `group` panels (the unit of threading and
// of the row loop: a group's panels are read from memory by its first row tile and from the
// cache by the others).
struct Shapes {
  int rows, group;
  int panels[kMaxTileRows + 1];
  TileFn fn[kMaxTileRows + 1][kMaxTilePanels + 1];
};

template <template <int, int> class K, int M, int NP>
void fill_one(Shapes& s) {
  s.fn[M][NP] = &K<M, NP>::run;
}
template <template <int, int> class K, int... Ms>
void fill(Shapes& s, std::integer_sequence<int, Ms...>) {
  ((fill_one<K, Ms + 1, 1>(s), fill_one<K, Ms + 1, 2>(s), fill_one<K, Ms + 1, 3>(s)), ...);
}

template <int M, int NP>
struct Portable {
  static void run(const float* x, int64_t ldx, const float* p, int64_t in, float* out, const char*, int64_t) {
    tile_portable<M, NP>(x, ldx, p, in, out);
  }
};
#ifdef HYFLOW_DECODE_X86
template <int M, int NP>
struct Avx2 {
  static void run(const float* x, int64_t ldx, const float* p, int64_t in, float* out, const char* next,
                  int64_t lines) {
    tile_avx2<M, NP>(x, ldx, p, in, out, next, lines);
  }
};
template <int M, int NP>
struct Avx512 {
  static void run(const float* x, int64_t ldx, const float* p, int64_t in, float* out, const char* next,
                  int64_t lines) {
    tile_avx512<M, NP>(x, ldx, p, in, out, next, lines);
  }
};
#endif

const Shapes& shapes(Isa isa) {
  static const Shapes portable = [] {
    Shapes s{.rows = 4, .group = 2, .panels = {}, .fn = {}};
    for (int m = 1; m <= kMaxTileRows; ++m) s.panels[m] = 2;
    fill<Portable>(s, std::make_integer_sequence<int, kMaxTileRows>());
    return s;
  }();
#ifdef HYFLOW_DECODE_X86
  static const Shapes avx2 = [] {
    // 6 x 1 panel = 12 ymm accumulators; up to 3 rows take 2 panels (the batch-1 tile reads
    // two streams at once).
    Shapes s{.rows = 6, .group = 2, .panels = {}, .fn = {}};
    for (int m = 1; m <= kMaxTileRows; ++m) s.panels[m] = m <= 3 ? 2 : 1;
    fill<Avx2>(s, std::make_integer_sequence<int, kMaxTileRows>());
    return s;
  }();
  static const Shapes avx512 = [] {
    // 8 x 3 panels = 24 zmm accumulators.
    Shapes s{.rows = 8, .group = 3, .panels = {}, .fn = {}};
    for (int m = 1; m <= kMaxTileRows; ++m) s.panels[m] = 3;
    fill<Avx512>(s, std::make_integer_sequence<int, kMaxTileRows>());
    return s;
  }();
  if (isa == Isa::kAvx512) return avx512;
  if (isa == Isa::kAvx2) return avx2;
#endif
  (void)isa;
  return portable;
}

void linear_impl(const Shapes& sh, const float* x, int64_t ldx, int64_t rows, const float* packed, const float* bias,
                 int64_t in, int64_t out, float* y, int64_t ldy, bool accumulate) {
  const int64_t panels = (out + kPanel - 1) / kPanel;
  const int64_t groups = (panels + sh.group - 1) / sh.group;
  const int64_t panel_floats = in * kPanel;
  // Enough work per thread chunk to amortize a task (~64K multiply-adds).
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, rows * panel_floats * sh.group));
  // With several row tiles, the first would wait on memory for the group's panels and the others
  // find them in the cache: instead the row tiles of each group fetch the next group's panels
  // (of the same thread), a share each, so that the stream overlaps the arithmetic.
  const int64_t tiles = (rows + sh.rows - 1) / sh.rows;
  const int64_t group_lines = sh.group * panel_floats * static_cast<int64_t>(sizeof(float)) / 64;
  const int64_t share = tiles > 1 ? (group_lines + tiles - 1) / tiles : 0;
  parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    alignas(64) float sums[kMaxTileRows * kMaxTilePanels * kPanel];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = g * sh.group, p1 = std::min(panels, p0 + sh.group);
      const auto* next = reinterpret_cast<const char*>(packed + p1 * panel_floats);
      const int64_t next_lines = g + 1 < g1 ? std::min(group_lines, (panels - p1) * panel_floats * 4 / 64) : 0;
      for (int64_t m = 0; m < rows; m += sh.rows) {
        const int mr = static_cast<int>(std::min<int64_t>(sh.rows, rows - m));
        const int64_t first = m / sh.rows * share;
        const int64_t lines = std::max<int64_t>(0, std::min(share, next_lines - first));
        for (int64_t p = p0; p < p1; p += sh.panels[mr]) {
          const int np = static_cast<int>(std::min<int64_t>(sh.panels[mr], p1 - p));
          sh.fn[mr][np](x + m * ldx, ldx, packed + p * panel_floats, in, sums, next + first * 64,
                        p == p0 ? lines : 0);
          const int width = np * static_cast<int>(kPanel);
          const int64_t o0 = p * kPanel;
          const int cols = static_cast<int>(std::min<int64_t>(width, out - o0));
          for (int r = 0; r < mr; ++r) {
            float* dst = y + (m + r) * ldy + o0;
            const float* src = sums + r * width;
            for (int c = 0; c < cols; ++c) {
              const float v = bias != nullptr ? src[c] + bias[o0 + c] : src[c];
              dst[c] = accumulate ? dst[c] + v : v;
            }
          }
        }
      }
    }
  });
}

#ifdef HYFLOW_DECODE_X86
// out[0 .. 8 NV) = sum_s (scores[s] / total) v_s[0 .. 8 NV), the sum kept in registers and taken in
// position order (one fma per position).
template <int NV>
__attribute__((target("avx2,fma"))) void weighted_sum_avx2(const float* scores, float total, const float* v,
                                                           const int32_t* blocks, int64_t block_size,
                                                           int64_t block_stride, int64_t stride, int64_t length,
                                                           float* out) {
  __m256 acc[NV];
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0, s = 0; s < length; ++b) {
    const float* base = v + static_cast<int64_t>(blocks[b]) * block_stride;
    const int64_t n = std::min(block_size, length - s);
    for (int64_t i = 0; i < n; ++i, ++s) {
      const __m256 p = _mm256_set1_ps(scores[s] / total);
      const float* vs = base + i * stride;
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vs + 8 * j), acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) _mm256_storeu_ps(out + 8 * j, acc[j]);
}
#endif

// Calls f(s, pointer to position s's row) for s < length, walking the block table (no division
// per position).
template <class F>
void for_positions(const float* base, const int32_t* blocks, int64_t block_size, int64_t block_stride, int64_t stride,
                   int64_t length, F&& f) {
  for (int64_t b = 0, s = 0; s < length; ++b) {
    const float* block = base + static_cast<int64_t>(blocks[b]) * block_stride;
    const int64_t n = std::min(block_size, length - s);
    for (int64_t i = 0; i < n; ++i, ++s) f(s, block + i * stride);
  }
}

template <bool Avx2>
void attend_impl(const float* q, const float* k, const float* v, const int32_t* blocks, int64_t block_size,
                 int64_t block_stride, int64_t stride, int64_t length, int64_t dim, float* scores, float* out) {
  auto dot = [&](const float* a, const float* b) {
#ifdef HYFLOW_DECODE_X86
    if constexpr (Avx2) return dot_avx2(a, b, dim);
#endif
    return dot_portable(a, b, dim);
  };
  const float scale = std::sqrt(static_cast<float>(dim));
  float max_score = -std::numeric_limits<float>::infinity();
  // Block by block; at the start of each, fetch the next block's keys and this block's values
  // (read by the second pass) into the cache: the blocks are short streams at scattered places
  // that the hardware prefetcher reaches late.
  auto fetch = [&](const float* from, int64_t n) {
#ifdef HYFLOW_DECODE_X86
    const auto* p = reinterpret_cast<const char*>(from);
    const int64_t bytes = static_cast<int64_t>(((n - 1) * stride + dim) * sizeof(float));
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
#else
    (void)from;
    (void)n;
#endif
  };
  for (int64_t b = 0, s = 0; s < length; ++b) {
    const int64_t n = std::min(block_size, length - s);
    const int64_t offset = static_cast<int64_t>(blocks[b]) * block_stride;
    if (s + n < length) {
      fetch(k + static_cast<int64_t>(blocks[b + 1]) * block_stride, std::min(block_size, length - s - n));
    }
    fetch(v + offset, n);
    for (int64_t i = 0; i < n; ++i, ++s) {
      scores[s] = dot(q, k + offset + i * stride) / scale;
      max_score = std::max(max_score, scores[s]);
    }
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
  int64_t d = 0;
#ifdef HYFLOW_DECODE_X86
  if constexpr (Avx2) {
    // 64 dims at a time in 8 registers, then the last whole vectors; the rest below.
    for (; d + 64 <= dim; d += 64) {
      weighted_sum_avx2<8>(scores, total, v + d, blocks, block_size, block_stride, stride, length, out + d);
    }
    const int64_t nv = (dim - d) / 8;
    auto run = [&]<int NV>() {
      weighted_sum_avx2<NV>(scores, total, v + d, blocks, block_size, block_stride, stride, length, out + d);
      d += 8 * NV;
    };
    switch (nv) {
      case 7:
        run.template operator()<7>();
        break;
      case 6:
        run.template operator()<6>();
        break;
      case 5:
        run.template operator()<5>();
        break;
      case 4:
        run.template operator()<4>();
        break;
      case 3:
        run.template operator()<3>();
        break;
      case 2:
        run.template operator()<2>();
        break;
      case 1:
        run.template operator()<1>();
        break;
      default:
        break;
    }
  }
#endif
  if (d < dim) {
    std::fill(out + d, out + dim, 0.0F);
    for_positions(v, blocks, block_size, block_stride, stride, length, [&](int64_t s, const float* vs) {
      const float p = scores[s] / total;
      for (int64_t i = d; i < dim; ++i) out[i] += p * vs[i];
    });
  }
}

}  // namespace

Isa kernel_isa() {
  return current_isa();
}

Isa best_kernel_isa() {
  return cpu_isa();
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "portable";
  }
}

void limit_kernel_isa(Isa max) {
  g_isa_limit.store(static_cast<int>(max));
}

int64_t packed_size(int64_t in, int64_t out) {
  return (out + kPanel - 1) / kPanel * kPanel * in;
}

void pack_weight(const float* w, int64_t in, int64_t out, float* packed) {
  const int64_t panels = (out + kPanel - 1) / kPanel;
  parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* dst = packed + p * in * kPanel;
      for (int64_t j = 0; j < kPanel; ++j) {
        const int64_t o = p * kPanel + j;
        if (o < out) {
          const float* row = w + o * in;
          for (int64_t k = 0; k < in; ++k) dst[k * kPanel + j] = row[k];
        } else {
          for (int64_t k = 0; k < in; ++k) dst[k * kPanel + j] = 0.0F;
        }
      }
    }
  });
}

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
#ifdef _OPENMP
  // This file's OpenMP runtime is LibTorch's on Debian (one libgomp); a LibTorch that bundles its
  // own copy keeps torch::set_num_threads in that copy, so follow it here (per calling thread).
  const int threads = at::get_num_threads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
#endif
  at::parallel_for(begin, end, grain, f);
}

void linear(const float* x, int64_t ldx, int64_t rows, const float* packed, const float* bias, int64_t in, int64_t out,
            float* y, int64_t ldy, bool accumulate) {
  if (rows <= 0 || out <= 0) return;
  linear_impl(shapes(current_isa()), x, ldx, rows, packed, bias, in, out, y, ldy, accumulate);
}

void attend(const float* q, const float* k, const float* v, const int32_t* blocks, int64_t block_size,
            int64_t block_stride, int64_t stride, int64_t length, int64_t dim, float* scores, float* out) {
  if (use_avx2()) {
    attend_impl<true>(q, k, v, blocks, block_size, block_stride, stride, length, dim, scores, out);
  } else {
    attend_impl<false>(q, k, v, blocks, block_size, block_stride, stride, length, dim, scores, out);
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
