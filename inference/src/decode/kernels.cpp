// The decode engine's kernels: a small-batch GEMM on packed weights (panels of 16 output
// columns, k-major) with a broadcast register tile, and paged attention (per head, and a pass's
// rows at once), in AVX-512, AVX2+FMA and portable builds chosen at run time. No global -march flag:
// the vector functions carry target attributes, so the library still runs on CPUs without
// AVX2 (and builds on non-x86 hosts, where only the portable build exists).
#include "kernels.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __linux__
#include <sys/mman.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HYFLOW_DECODE_X86 1
#endif

namespace hyflow::inference::decode {
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
// E: the element of x and of the packed panels: float, or uint32_t (a pair of bf16, linear_bf16) with
// `in` counting the pairs.
template <class E>
using TileFnOf = void (*)(const E* x, int64_t ldx, const E* p, int64_t in, float* out, const char* next,
                          int64_t lines);
using TileFn = TileFnOf<float>;

// Batch 1 (a GEMV): one activation row against kGemvPanels panels side by side, one accumulator chain
// per output (the tiles' chain, so the results equal theirs bit for bit). p: the first panel, the
// others at stride in * 16; out: NP * 16 sums. Each panel's line kGemvAhead k steps ahead is fetched
// into L2 (prefetcht1) every step; in the last kGemvAhead steps the fetch moves on to the same line of
// the next group's panel (next: its first panel; next_panels of them exist), so that the whole weight
// is one stream fetched well ahead: on this AMD Zen 4 a one-row tile that fetched 2 KiB ahead into L1
// over 3 panels read 16-18 GB/s where the same loop over 8 panels fetching 4 KiB ahead into L2 reads
// 24-27 (loaded machine; bench/README.md, "bf16 side by side with llama2.c").
constexpr int kGemvPanels = 8;
constexpr int64_t kGemvAhead = 64;  // k steps: 4 KiB per panel
template <class E>
using GemvFnOf = void (*)(const E* x, const E* p, int64_t in, float* out, const E* next, int next_panels);

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

// The batch-1 tile (GemvFnOf): one zmm accumulator per panel.
template <int NP>
__attribute__((target("avx512f"))) void gemv_avx512(const float* x, const float* p, int64_t in, float* out,
                                                    const float* next, int next_panels) {
  __m512 acc[NP];
#pragma GCC unroll 8
  for (int n = 0; n < NP; ++n) acc[n] = _mm512_setzero_ps();
  const int64_t stride = in * kPanel, split = std::max<int64_t>(0, in - kGemvAhead);
  int64_t k = 0;
#pragma GCC unroll 2
  for (; k < split; ++k) {
    const __m512 xv = _mm512_set1_ps(x[k]);
#pragma GCC unroll 8
    for (int n = 0; n < NP; ++n) {
      const float* pk = p + n * stride + k * kPanel;
      _mm_prefetch(reinterpret_cast<const char*>(pk + kGemvAhead * kPanel), _MM_HINT_T1);
      acc[n] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(pk), acc[n]);
    }
  }
  for (; k < in; ++k) {
    const __m512 xv = _mm512_set1_ps(x[k]);
    const int64_t kn = k + kGemvAhead - in;  // the next group's step to fetch
    const int fetch = kn < in ? next_panels : 0;
#pragma GCC unroll 8
    for (int n = 0; n < NP; ++n) {
      if (n < fetch) _mm_prefetch(reinterpret_cast<const char*>(next + n * stride + kn * kPanel), _MM_HINT_T1);
      acc[n] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(p + n * stride + k * kPanel), acc[n]);
    }
  }
#pragma GCC unroll 8
  for (int n = 0; n < NP; ++n) _mm512_storeu_ps(out + n * kPanel, acc[n]);
}

// The batch-1 tile of the AVX2 build: two ymm accumulators per panel.
template <int NP>
__attribute__((target("avx2,fma"))) void gemv_avx2(const float* x, const float* p, int64_t in, float* out,
                                                   const float* next, int next_panels) {
  __m256 acc[NP][2];
#pragma GCC unroll 8
  for (int n = 0; n < NP; ++n) acc[n][0] = acc[n][1] = _mm256_setzero_ps();
  const int64_t stride = in * kPanel;
  for (int64_t k = 0; k < in; ++k) {
    const __m256 xv = _mm256_broadcast_ss(x + k);
    const int64_t kn = k + kGemvAhead - in;
    const int fetch = kn < 0 ? NP : (kn < in ? next_panels : 0);
#pragma GCC unroll 8
    for (int n = 0; n < NP; ++n) {
      const float* pk = p + n * stride + k * kPanel;
      if (n < fetch) {
        const float* f = kn < 0 ? pk + kGemvAhead * kPanel : next + n * stride + kn * kPanel;
        _mm_prefetch(reinterpret_cast<const char*>(f), _MM_HINT_T1);
      }
      acc[n][0] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(pk), acc[n][0]);
      acc[n][1] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(pk + 8), acc[n][1]);
    }
  }
#pragma GCC unroll 8
  for (int n = 0; n < NP; ++n) {
    _mm256_storeu_ps(out + n * kPanel, acc[n][0]);
    _mm256_storeu_ps(out + n * kPanel + 8, acc[n][1]);
  }
}

// Out of line, always: attend() and attend_rows() run this one body, so that the compiler's choices
// for the scalar tail (GCC contracts it into fmas and may vectorize part of it) are the same for both.
__attribute__((target("avx2,fma"), noinline)) float dot_avx2(const float* a, const float* b, int64_t n) {
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

// The vector exp's constants (exp_avx2, exp_avx512): Cody-Waite range reduction by ln 2 in two
// parts and a degree-5 polynomial (the Cephes expf scheme, within 2 ulp of the correctly rounded
// value for |x| < 88), highest coefficient first.
constexpr float kExpMin = -87.3F, kExpMax = 88.3F, kLog2e = 1.44269504088896341F;
constexpr float kLn2High = 0.693359375F, kLn2Low = -2.12194440e-4F;
constexpr float kExpPoly[6] = {1.9875691500e-4F, 1.3981999507e-3F, 8.3334519073e-3F,
                               4.1665795894e-2F, 1.6666665459e-1F, 5.0000001201e-1F};

// exp(x) for 8 floats.
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kExpMax));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5F)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2High), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Low), x);
  __m256 y = _mm256_set1_ps(kExpPoly[0]);
#pragma GCC unroll 5
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpPoly[i]));
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

// GCC 12 warns about the undefined vector inside some AVX-512 intrinsics, which their results never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// exp_avx2's operations on 16 lanes.
__attribute__((target("avx512f,avx2,fma"))) inline __m512 exp_avx512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax));
  const __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5F)),
                                         _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(kLn2High), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(kLn2Low), x);
  __m512 y = _mm512_set1_ps(kExpPoly[0]);
#pragma GCC unroll 5
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kExpPoly[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0F)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

// silu_mul_avx2's arithmetic: 16 lanes, then its own 8-lane loop and scalar tail (so every element
// takes the path it takes there: the vector exp below n / 8 * 8, std::exp past it).
__attribute__((target("avx512f,avx2,fma"))) void silu_mul_avx512(float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0F);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
  silu_mul_avx2(gate + i, up + i, n - i);
}

// std::max_element's index (the first maximum by operator<) for z without NaN; `nan` tells whether
// z has one (the caller then takes std::max_element: a NaN lane would not follow its order).
__attribute__((target("avx512f,avx2,fma"))) int64_t argmax_avx512(const float* z, int64_t n, bool& nan) {
  nan = false;
  if (n < 16 || n > std::numeric_limits<int32_t>::max()) return -1;
  __m512 best = _mm512_loadu_ps(z);
  __m512i best_i = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i idx = best_i;
  const __m512i step = _mm512_set1_epi32(16);
  __mmask16 unordered = _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q);
  int64_t i = 16;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(z + i);
    idx = _mm512_add_epi32(idx, step);
    const __mmask16 greater = _mm512_cmp_ps_mask(best, v, _CMP_LT_OQ);  // best < v: v is the lane's new max
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    best = _mm512_mask_mov_ps(best, greater, v);
    best_i = _mm512_mask_mov_epi32(best_i, greater, idx);
  }
  if (unordered != 0) {
    nan = true;
    return -1;
  }
  alignas(64) float values[16];
  alignas(64) int32_t index[16];
  _mm512_store_ps(values, best);
  _mm512_store_si512(index, best_i);
  // The first index holding the maximum: lanes equal to it (+0 == -0), the smallest index.
  int64_t arg = index[0];
  float max = values[0];
  for (int l = 1; l < 16; ++l) {
    if (max < values[l] || (values[l] == max && index[l] < arg)) {
      max = values[l];
      arg = index[l];
    }
  }
  for (; i < n; ++i) {
    if (z[i] != z[i]) {
      nan = true;
      return -1;
    }
    if (max < z[i]) {
      max = z[i];
      arg = i;
    }
  }
  return arg;
}
#pragma GCC diagnostic pop

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
template <class E>
struct ShapesOf {
  int rows, group;
  int panels[kMaxTileRows + 1];
  TileFnOf<E> fn[kMaxTileRows + 1][kMaxTilePanels + 1];
  GemvFnOf<E> gemv[kGemvPanels + 1];  // [panels]: batch 1 in groups of kGemvPanels; null: the tiles
};

template <template <int> class K, class S, int... Ns>
void fill_gemv(S& s, std::integer_sequence<int, Ns...>) {
  ((s.gemv[Ns + 1] = &K<Ns + 1>::run), ...);
}
using Shapes = ShapesOf<float>;

template <template <int, int> class K, int M, int NP, class S>
void fill_one(S& s) {
  s.fn[M][NP] = &K<M, NP>::run;
}
template <template <int, int> class K, class S, int... Ms>
void fill(S& s, std::integer_sequence<int, Ms...>) {
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
template <int NP>
struct GemvAvx2 {
  static void run(const float* x, const float* p, int64_t in, float* out, const float* next, int next_panels) {
    gemv_avx2<NP>(x, p, in, out, next, next_panels);
  }
};
template <int NP>
struct GemvAvx512 {
  static void run(const float* x, const float* p, int64_t in, float* out, const float* next, int next_panels) {
    gemv_avx512<NP>(x, p, in, out, next, next_panels);
  }
};
#endif

const Shapes& shapes(Isa isa) {
  static const Shapes portable = [] {
    Shapes s{.rows = 4, .group = 2, .panels = {}, .fn = {}, .gemv = {}};
    for (int m = 1; m <= kMaxTileRows; ++m) s.panels[m] = 2;
    fill<Portable>(s, std::make_integer_sequence<int, kMaxTileRows>());
    return s;
  }();
#ifdef HYFLOW_DECODE_X86
  static const Shapes avx2 = [] {
    // 6 x 1 panel = 12 ymm accumulators; up to 3 rows take 2 panels (the batch-1 tile reads
    // two streams at once).
    Shapes s{.rows = 6, .group = 2, .panels = {}, .fn = {}, .gemv = {}};
    for (int m = 1; m <= kMaxTileRows; ++m) s.panels[m] = m <= 3 ? 2 : 1;
    fill<Avx2>(s, std::make_integer_sequence<int, kMaxTileRows>());
    fill_gemv<GemvAvx2>(s, std::make_integer_sequence<int, kGemvPanels>());
    return s;
  }();
  static const Shapes avx512 = [] {
    // 8 x 3 panels = 24 zmm accumulators.
    Shapes s{.rows = 8, .group = 3, .panels = {}, .fn = {}, .gemv = {}};
    for (int m = 1; m <= kMaxTileRows; ++m) s.panels[m] = 3;
    fill<Avx512>(s, std::make_integer_sequence<int, kMaxTileRows>());
    fill_gemv<GemvAvx512>(s, std::make_integer_sequence<int, kGemvPanels>());
    return s;
  }();
  if (isa == Isa::kAvx512) return avx512;
  if (isa == Isa::kAvx2) return avx2;
#endif
  (void)isa;
  return portable;
}

// in: the elements of a row of x and of a panel's k steps (bf16 pairs for E = uint32_t).
template <class E>
void linear_impl(const ShapesOf<E>& sh, const E* x, int64_t ldx, int64_t rows, const E* packed, const float* bias,
                 int64_t in, int64_t out, float* y, int64_t ldy, bool accumulate) {
  const int64_t panels = (out + kPanel - 1) / kPanel;
  const int64_t panel_floats = in * kPanel;
  // The threads take equal runs of panels (a run's last group may be short): in whole groups, the
  // 32 panels of a 512-wide output would split 6 : 5 groups. Enough work per run to amortize a
  // task (~64K multiply-adds).
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, rows * panel_floats));
  // With several row tiles, the first would wait on memory for the group's panels and the others
  // find them in the cache: instead the row tiles of each group fetch the next group's panels
  // (of the same thread), a share each, so that the stream overlaps the arithmetic.
  const int64_t tiles = (rows + sh.rows - 1) / sh.rows;
  const int64_t panel_lines = panel_floats * static_cast<int64_t>(sizeof(E)) / 64;
  const int64_t group_lines = sh.group * panel_lines;
  const int64_t share = tiles > 1 ? (group_lines + tiles - 1) / tiles : 0;
  // Adds bias and, with accumulate, y's values to the sums of rows [m, m + mr) x panels [p, p + np), into y.
  auto store = [&](const float* sums, int64_t m, int mr, int64_t p, int np) {
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
  };
  if (rows == 1 && sh.gemv[1] != nullptr) {
    parallel_for(0, panels, grain, [&](int64_t run0, int64_t run1) {
      alignas(64) float sums[kGemvPanels * kPanel];
      for (int64_t p0 = run0; p0 < run1; p0 += kGemvPanels) {
        const int64_t p1 = std::min<int64_t>(run1, p0 + kGemvPanels);
        const int np = static_cast<int>(p1 - p0);
        const int next = static_cast<int>(std::min<int64_t>(kGemvPanels, run1 - p1));
        sh.gemv[np](x, packed + p0 * panel_floats, in, sums, packed + p1 * panel_floats, next);
        store(sums, 0, 1, p0, np);
      }
    });
    return;
  }
  parallel_for(0, panels, grain, [&](int64_t run0, int64_t run1) {
    alignas(64) float sums[kMaxTileRows * kMaxTilePanels * kPanel];
    for (int64_t p0 = run0; p0 < run1; p0 += sh.group) {
      const int64_t p1 = std::min(run1, p0 + sh.group);
      const auto* next = reinterpret_cast<const char*>(packed + p1 * panel_floats);
      const int64_t next_lines = std::min(group_lines, (run1 - p1) * panel_lines);
      for (int64_t m = 0; m < rows; m += sh.rows) {
        const int mr = static_cast<int>(std::min<int64_t>(sh.rows, rows - m));
        const int64_t first = m / sh.rows * share;
        const int64_t lines = std::max<int64_t>(0, std::min(share, next_lines - first));
        for (int64_t p = p0; p < p1; p += sh.panels[mr]) {
          const int np = static_cast<int>(std::min<int64_t>(sh.panels[mr], p1 - p));
          sh.fn[mr][np](x + m * ldx, ldx, packed + p * panel_floats, in, sums, next + first * 64,
                        p == p0 ? lines : 0);
          store(sums, m, mr, p, np);
        }
      }
    }
  });
}

// ---- bf16 GEMM (linear_bf16) ------------------------------------------------------------
// A packed bf16 panel holds, per pair of k, one 32-bit word per output column: bf16(w[o, 2 kp]) in
// the low half, bf16(w[o, 2 kp + 1]) in the high half (vdpbf16ps's operand layout); x is converted to
// the same pairs. Every output is the chain acc = acc + x1 w1, then acc = acc + x0 w0 per pair, from
// acc = 0, rounded to float32 after each add (vdpbf16ps's definition in the Intel SDM, round to
// nearest even); the products of two bf16 are exact in float32, so the portable build computes the
// same chain with plain float arithmetic. The hardware also treats bf16 denormal inputs as 0 and
// flushes denormal results, which the portable build does not: they differ only there.

float bf16_low(uint32_t pair) {
  return from_bf16(static_cast<uint16_t>(pair & 0xFFFFU));
}
float bf16_high(uint32_t pair) {
  return from_bf16(static_cast<uint16_t>(pair >> 16));
}

template <int M, int NP>
struct Bf16Portable {
  static void run(const uint32_t* x, int64_t ldx, const uint32_t* p, int64_t in2, float* out, const char*,
                  int64_t) {
    constexpr int W = NP * kPanel;
    float acc[M][W] = {};
    const int64_t stride = in2 * kPanel;
    for (int64_t kp = 0; kp < in2; ++kp) {
      for (int m = 0; m < M; ++m) {
        const uint32_t xw = x[m * ldx + kp];
        const float x0 = bf16_low(xw), x1 = bf16_high(xw);
        for (int n = 0; n < NP; ++n) {
          const uint32_t* w = p + n * stride + kp * kPanel;
          for (int j = 0; j < kPanel; ++j) {
            float a = acc[m][n * kPanel + j];
            a = a + x1 * bf16_high(w[j]);
            acc[m][n * kPanel + j] = a + x0 * bf16_low(w[j]);
          }
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      for (int j = 0; j < W; ++j) out[m * W + j] = acc[m][j];
    }
  }
};

#ifdef HYFLOW_DECODE_X86
// One zmm (16 outputs, 32 bf16 of a panel's k pair) per panel: M * NP accumulators (at most 24).
template <int M, int NP>
struct Bf16Avx512 {
  __attribute__((target("avx512f,avx512bf16"))) static void run(const uint32_t* x, int64_t ldx, const uint32_t* p,
                                                                 int64_t in2, float* out, const char* next,
                                                                 int64_t lines) {
    __m512 acc[M][NP];
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
      for (int n = 0; n < NP; ++n) acc[m][n] = _mm512_setzero_ps();
    }
    const int64_t stride = in2 * kPanel;
#pragma GCC unroll 2
    for (int64_t kp = 0; kp < in2; ++kp) {
      __m512i w[NP];
#pragma GCC unroll 4
      for (int n = 0; n < NP; ++n) {
        const uint32_t* pk = p + n * stride + kp * kPanel;
        _mm_prefetch(reinterpret_cast<const char*>(pk + kPrefetchAhead * kPanel), _MM_HINT_T0);
        w[n] = _mm512_loadu_si512(pk);
      }
      fetch_next(next, lines, kp, in2);
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        const __m512i xv = _mm512_set1_epi32(static_cast<int>(x[m * ldx + kp]));
#pragma GCC unroll 4
        for (int n = 0; n < NP; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], (__m512bh)w[n], (__m512bh)xv);
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
      for (int n = 0; n < NP; ++n) _mm512_storeu_ps(out + (m * NP + n) * kPanel, acc[m][n]);
    }
  }
};

// The batch-1 tile (GemvFnOf, gemv_avx512's fetching): one zmm accumulator per panel, in2 pairs of k.
template <int NP>
struct GemvBf16Avx512 {
  __attribute__((target("avx512f,avx512bf16"))) static void run(const uint32_t* x, const uint32_t* p, int64_t in2,
                                                                 float* out, const uint32_t* next, int next_panels) {
    __m512 acc[NP];
#pragma GCC unroll 8
    for (int n = 0; n < NP; ++n) acc[n] = _mm512_setzero_ps();
    const int64_t stride = in2 * kPanel, split = std::max<int64_t>(0, in2 - kGemvAhead);
    int64_t k = 0;
#pragma GCC unroll 2
    for (; k < split; ++k) {
      const __m512i xv = _mm512_set1_epi32(static_cast<int>(x[k]));
#pragma GCC unroll 8
      for (int n = 0; n < NP; ++n) {
        const uint32_t* pk = p + n * stride + k * kPanel;
        _mm_prefetch(reinterpret_cast<const char*>(pk + kGemvAhead * kPanel), _MM_HINT_T1);
        acc[n] = _mm512_dpbf16_ps(acc[n], (__m512bh)_mm512_loadu_si512(pk), (__m512bh)xv);
      }
    }
    for (; k < in2; ++k) {
      const __m512i xv = _mm512_set1_epi32(static_cast<int>(x[k]));
      const int64_t kn = k + kGemvAhead - in2;
      const int fetch = kn < in2 ? next_panels : 0;
#pragma GCC unroll 8
      for (int n = 0; n < NP; ++n) {
        if (n < fetch) _mm_prefetch(reinterpret_cast<const char*>(next + n * stride + kn * kPanel), _MM_HINT_T1);
        acc[n] = _mm512_dpbf16_ps(acc[n], (__m512bh)_mm512_loadu_si512(p + n * stride + k * kPanel), (__m512bh)xv);
      }
    }
#pragma GCC unroll 8
    for (int n = 0; n < NP; ++n) _mm512_storeu_ps(out + n * kPanel, acc[n]);
  }
};

// to_bf16 of 16 floats at once (the same integer arithmetic), stored as 16 consecutive bf16.
// (GCC 12 warns about the undefined vector inside some AVX-512 intrinsics, which their results never read.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f"))) void to_bf16_16(const float* x, uint16_t* out) {
  const __m512i bits = _mm512_loadu_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i half = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb);
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, half), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x0040));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i words = _mm512_mask_mov_epi32(rounded, nan, quiet);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(words));
}
#pragma GCC diagnostic pop

bool cpu_bf16_dot() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
}
#else
bool cpu_bf16_dot() {
  return false;
}
#endif

// HYFLOW_DECODE_BF16=portable turns vdpbf16ps off for the process (allow_bf16_dot(true) turns it on again).
std::atomic<bool> g_bf16_dot_allowed{[] {
  const char* env = std::getenv("HYFLOW_DECODE_BF16");
  return env == nullptr || std::string_view(env) != "portable";
}()};

const ShapesOf<uint32_t>& bf16_shapes(bool dot) {
  static const ShapesOf<uint32_t> portable = [] {
    ShapesOf<uint32_t> s{.rows = 4, .group = 2, .panels = {}, .fn = {}, .gemv = {}};
    for (int m = 1; m <= kMaxTileRows; ++m) s.panels[m] = 2;
    fill<Bf16Portable>(s, std::make_integer_sequence<int, kMaxTileRows>());
    return s;
  }();
#ifdef HYFLOW_DECODE_X86
  static const ShapesOf<uint32_t> avx512 = [] {
    // 8 x 3 panels = 24 zmm accumulators, as the float32 AVX-512 build.
    ShapesOf<uint32_t> s{.rows = 8, .group = 3, .panels = {}, .fn = {}, .gemv = {}};
    for (int m = 1; m <= kMaxTileRows; ++m) s.panels[m] = 3;
    fill<Bf16Avx512>(s, std::make_integer_sequence<int, kMaxTileRows>());
    fill_gemv<GemvBf16Avx512>(s, std::make_integer_sequence<int, kGemvPanels>());
    return s;
  }();
  if (dot) return avx512;
#endif
  (void)dot;
  return portable;
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

// Fetches the cache lines of [p, p + bytes) into L1 (prefetcht0 on x86; a no-op where the target has no
// prefetch).
void fetch_lines(const void* p, int64_t bytes) {
  const auto* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

// scores[s] = exp(scores[s] - max) for s < n with std::exp; returns their sum in position order.
float exp_shift_portable(float* scores, int64_t n, float max) {
  float total = 0.0F;
  for (int64_t s = 0; s < n; ++s) {
    scores[s] = std::exp(scores[s] - max);
    total += scores[s];
  }
  return total;
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
    fetch_lines(from, static_cast<int64_t>(((n - 1) * stride + dim) * sizeof(float)));
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
#ifdef HYFLOW_DECODE_X86
  const float total =
      Avx2 ? exp_shift_avx2(scores, length, max_score) : exp_shift_portable(scores, length, max_score);
#else
  const float total = exp_shift_portable(scores, length, max_score);
#endif
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

// ---- a pass's attention: every (row, query head) at once --------------------------------
// attend_rows computes what attend() computes for each (row, query head), bit for bit: the same
// dot product (per build), score / sqrt(dim), the running max in position order, the same exp and
// sum, p = score / total, and the weighted sum of values in position order from 0 per dimension
// (one fma per position on the first dim / 8 * 8 dimensions in the vector builds, a product then a
// sum on the rest and everywhere in the portable build). What changes is the order memory is
// visited: a segment of one row's kv heads is walked block by block, all its heads in a block
// being one contiguous run (every head of a block at 42M: 32 KiB of keys), each key read once for
// the query heads of its GQA group, the next block fetched ahead; the accumulators of the weighted
// sum live in `out` between blocks (a store and a load are exact).

// Keys of `n` positions of one kv head in a block against `nq` query heads (q: nq x dim):
// sc[j * ld + i] = dot(q_j, key_i) / scale, maxes[j] = max(maxes[j], sc) in position order.
// KV: the cache's element, float or uint16_t (bf16, attend_rows_bf16).
template <class KV = float>
using ScoresFn = void (*)(const float* q, int64_t nq, const KV* keys, int64_t n, int64_t dim, float scale, float* sc,
                          int64_t ld, float* maxes);
// scores[s] = exp(scores[s] - max) for s < n; returns their sum (each build's order).
using ExpFn = float (*)(float* scores, int64_t n, float max);
// acc[j * dim + d] += p[j * ld + i] * value_i[d] for i < n in order, query heads j < nq; query head j
// reads the values of kv head j / group: value_i at values + (j / group) * head_floats + i * dim.
template <class KV = float>
using WsumFn = void (*)(const float* p, int64_t ld, int64_t nq, int64_t group, const KV* values, int64_t head_floats,
                        int64_t n, int64_t dim, float* acc);

template <class KV = float>
struct AttentionOps {
  ScoresFn<KV> scores;
  ExpFn exp_shift;
  WsumFn<KV> wsum;
};

// A ScoresFn on one key at a time through Dot (dot_portable, or dot_avx2: out of line, so the
// same arithmetic wherever it is called from).
template <float (*Dot)(const float*, const float*, int64_t)>
void scores_with(const float* q, int64_t nq, const float* keys, int64_t n, int64_t dim, float scale, float* sc,
                 int64_t ld, float* maxes) {
  for (int64_t j = 0; j < nq; ++j) {
    const float* qj = q + j * dim;
    float* sj = sc + j * ld;
    float max = maxes[j];
    for (int64_t i = 0; i < n; ++i) {
      const float s = Dot(qj, keys + i * dim, dim) / scale;
      sj[i] = s;
      max = std::max(max, s);
    }
    maxes[j] = max;
  }
}

// The tail of the weighted sum: dimensions [from, dim), a product then a sum (attend_impl's loop). Out
// of line and built for the baseline ISA, so that no build contracts it into an fma.
__attribute__((noinline)) void wsum_tail(const float* p, const float* values, int64_t n, int64_t dim, int64_t from,
                                         float* acc) {
  for (int64_t i = 0; i < n; ++i) {
    const float* vs = values + i * dim;
    for (int64_t d = from; d < dim; ++d) acc[d] += p[i] * vs[d];
  }
}

void wsum_portable(const float* p, int64_t ld, int64_t nq, int64_t group, const float* values, int64_t head_floats,
                   int64_t n, int64_t dim, float* acc) {
  for (int64_t j = 0; j < nq; ++j) wsum_tail(p + j * ld, values + (j / group) * head_floats, n, dim, 0, acc + j * dim);
}

#ifdef HYFLOW_DECODE_X86
// 8 NV dimensions of one query head: acc = fma(p_i, value_i, acc) for i < n.
template <int NV>
__attribute__((target("avx2,fma"))) void wsum_chunk_avx2(const float* p, const float* values, int64_t n, int64_t dim,
                                                         float* acc) {
  __m256 a[NV];
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) a[j] = _mm256_loadu_ps(acc + 8 * j);
  for (int64_t i = 0; i < n; ++i) {
    const __m256 pi = _mm256_set1_ps(p[i]);
    const float* vs = values + i * dim;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) a[j] = _mm256_fmadd_ps(pi, _mm256_loadu_ps(vs + 8 * j), a[j]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) _mm256_storeu_ps(acc + 8 * j, a[j]);
}

__attribute__((target("avx2,fma"))) void wsum_avx2(const float* p, int64_t ld, int64_t nq, int64_t group,
                                                   const float* head0, int64_t head_floats, int64_t n, int64_t dim,
                                                   float* acc) {
  using ChunkFn = void (*)(const float*, const float*, int64_t, int64_t, float*);
  static constexpr ChunkFn chunks[8] = {nullptr,
                                        &wsum_chunk_avx2<1>,
                                        &wsum_chunk_avx2<2>,
                                        &wsum_chunk_avx2<3>,
                                        &wsum_chunk_avx2<4>,
                                        &wsum_chunk_avx2<5>,
                                        &wsum_chunk_avx2<6>,
                                        &wsum_chunk_avx2<7>};
  const int64_t fused = dim / 8 * 8;
  for (int64_t j = 0; j < nq; ++j) {
    const float* pj = p + j * ld;
    const float* values = head0 + (j / group) * head_floats;
    float* a = acc + j * dim;
    int64_t d = 0;
    for (; d + 64 <= fused; d += 64) wsum_chunk_avx2<8>(pj, values + d, n, dim, a + d);
    if (d < fused) chunks[(fused - d) / 8](pj, values + d, n, dim, a + d);
    if (fused < dim) wsum_tail(pj, values, n, dim, fused, a);
  }
}

// dot_avx2's arithmetic for n a multiple of 8 (no scalar tail) in one zmm: its lanes 0-7 are
// dot_avx2's acc0, lanes 8-15 its acc1; then acc0 + acc1 and hsum's tree on lanes 0-7. (GCC 12 warns about the
// undefined vector inside the shuffle and extract intrinsics, which their results never read.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f,avx2,fma"))) inline float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc);
  if (k + 8 <= n) {
    acc =
        _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(0x00FF, a + k), _mm512_maskz_loadu_ps(0x00FF, b + k), acc, 0x00FF);
    k += 8;
  }
  const __m512 t = _mm512_add_ps(acc, _mm512_shuffle_f32x4(acc, acc, _MM_SHUFFLE(1, 0, 3, 2)));
  __m128 s4 = _mm_add_ps(_mm512_extractf32x4_ps(t, 0), _mm512_extractf32x4_ps(t, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// dot_avx512 of q with 16 consecutive keys (stride dim, a multiple of 8), their reduction trees run
// side by side: the same adds on the same lanes, 16 positions per instruction after the first
// level. Returns the 16 sums in position order.
__attribute__((target("avx512f,avx2,fma"))) inline __m512 dot16_avx512(const float* q, const float* keys, int64_t dim) {
  __m512 a[16];
#pragma GCC unroll 16
  for (int p = 0; p < 16; ++p) a[p] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= dim; k += 16) {
    const __m512 qv = _mm512_loadu_ps(q + k);
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) a[p] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + p * dim + k), a[p]);
  }
  if (k < dim) {  // 8 left: dot_avx2's acc0 only
    const __m512 qv = _mm512_maskz_loadu_ps(0x00FF, q + k);
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) {
      a[p] = _mm512_mask3_fmadd_ps(qv, _mm512_maskz_loadu_ps(0x00FF, keys + p * dim + k), a[p], 0x00FF);
    }
  }
  // acc0 + acc1 (lanes l and l + 8), two positions per register.
  __m512 u[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // hsum's first add (lanes 0-3 + lanes 4-7): v[i]'s 128-bit quarter m is position 4 i + m.
  __m512 v[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // Transpose each quarter's 4 x 4: s[e] lane 4 m + i holds element e of position 4 i + m.
  const __m512 t0 = _mm512_unpacklo_ps(v[0], v[1]), t1 = _mm512_unpackhi_ps(v[0], v[1]);
  const __m512 t2 = _mm512_unpacklo_ps(v[2], v[3]), t3 = _mm512_unpackhi_ps(v[2], v[3]);
  const __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1), d2 = _mm512_castps_pd(t2),
                d3 = _mm512_castps_pd(t3);
  const __m512 s0 = _mm512_castpd_ps(_mm512_unpacklo_pd(d0, d2)), s1 = _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d2));
  const __m512 s2 = _mm512_castpd_ps(_mm512_unpacklo_pd(d1, d3)), s3 = _mm512_castpd_ps(_mm512_unpackhi_pd(d1, d3));
  // hsum's last adds: (e0 + e2) + (e1 + e3); then back to position order.
  const __m512 sums = _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}

__attribute__((target("avx512f,avx2,fma"))) void scores_avx512(const float* q, int64_t nq, const float* keys, int64_t n,
                                                               int64_t dim, float scale, float* sc, int64_t ld,
                                                               float* maxes) {
  const __m512 scale16 = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < nq; ++j) {
    const float* qj = q + j * dim;
    float* sj = sc + j * ld;
    float max = maxes[j];
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(sj + i, _mm512_div_ps(dot16_avx512(qj, keys + i * dim, dim), scale16));
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) max = std::max(max, sj[i + t]);
    }
    for (; i < n; ++i) {
      const float s = dot_avx512(qj, keys + i * dim, dim) / scale;
      sj[i] = s;
      max = std::max(max, s);
    }
    maxes[j] = max;
  }
}
#pragma GCC diagnostic pop

// 16 NV dimensions of one query head (the last vector's lanes masked by `last`).
template <int NV>
__attribute__((target("avx512f,avx2,fma"))) void wsum_chunk_avx512(const float* p, const float* values, int64_t n,
                                                                   int64_t dim, float* acc, __mmask16 last) {
  __m512 a[NV];
#pragma GCC unroll 4
  for (int j = 0; j < NV - 1; ++j) a[j] = _mm512_loadu_ps(acc + 16 * j);
  a[NV - 1] = _mm512_maskz_loadu_ps(last, acc + 16 * (NV - 1));
  for (int64_t i = 0; i < n; ++i) {
    const __m512 pi = _mm512_set1_ps(p[i]);
    const float* vs = values + i * dim;
#pragma GCC unroll 4
    for (int j = 0; j < NV - 1; ++j) a[j] = _mm512_fmadd_ps(pi, _mm512_loadu_ps(vs + 16 * j), a[j]);
    a[NV - 1] = _mm512_fmadd_ps(pi, _mm512_maskz_loadu_ps(last, vs + 16 * (NV - 1)), a[NV - 1]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < NV - 1; ++j) _mm512_storeu_ps(acc + 16 * j, a[j]);
  _mm512_mask_storeu_ps(acc + 16 * (NV - 1), last, a[NV - 1]);
}

// wsum_chunk_avx512 for two query heads at once (two independent chains of fmas per register
// column: a position's fma latency is hidden behind the other head's).
template <int NV>
__attribute__((target("avx512f,avx2,fma"))) void wsum_pair_avx512(const float* p0, const float* v0, float* acc0,
                                                                  const float* p1, const float* v1, float* acc1,
                                                                  int64_t n, int64_t dim, __mmask16 last) {
  __m512 a[NV], b[NV];
#pragma GCC unroll 4
  for (int j = 0; j < NV - 1; ++j) {
    a[j] = _mm512_loadu_ps(acc0 + 16 * j);
    b[j] = _mm512_loadu_ps(acc1 + 16 * j);
  }
  a[NV - 1] = _mm512_maskz_loadu_ps(last, acc0 + 16 * (NV - 1));
  b[NV - 1] = _mm512_maskz_loadu_ps(last, acc1 + 16 * (NV - 1));
  for (int64_t i = 0; i < n; ++i) {
    const __m512 pa = _mm512_set1_ps(p0[i]), pb = _mm512_set1_ps(p1[i]);
    const float *va = v0 + i * dim, *vb = v1 + i * dim;
#pragma GCC unroll 4
    for (int j = 0; j < NV - 1; ++j) {
      a[j] = _mm512_fmadd_ps(pa, _mm512_loadu_ps(va + 16 * j), a[j]);
      b[j] = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vb + 16 * j), b[j]);
    }
    a[NV - 1] = _mm512_fmadd_ps(pa, _mm512_maskz_loadu_ps(last, va + 16 * (NV - 1)), a[NV - 1]);
    b[NV - 1] = _mm512_fmadd_ps(pb, _mm512_maskz_loadu_ps(last, vb + 16 * (NV - 1)), b[NV - 1]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < NV - 1; ++j) {
    _mm512_storeu_ps(acc0 + 16 * j, a[j]);
    _mm512_storeu_ps(acc1 + 16 * j, b[j]);
  }
  _mm512_mask_storeu_ps(acc0 + 16 * (NV - 1), last, a[NV - 1]);
  _mm512_mask_storeu_ps(acc1 + 16 * (NV - 1), last, b[NV - 1]);
}

__attribute__((target("avx512f,avx2,fma"))) void wsum_avx512(const float* p, int64_t ld, int64_t nq, int64_t group,
                                                             const float* head0, int64_t head_floats, int64_t n,
                                                             int64_t dim, float* acc) {
  using ChunkFn = void (*)(const float*, const float*, int64_t, int64_t, float*, __mmask16);
  static constexpr ChunkFn chunks[5] = {nullptr, &wsum_chunk_avx512<1>, &wsum_chunk_avx512<2>, &wsum_chunk_avx512<3>,
                                        &wsum_chunk_avx512<4>};
  using PairFn =
      void (*)(const float*, const float*, float*, const float*, const float*, float*, int64_t, int64_t, __mmask16);
  static constexpr PairFn pairs[5] = {nullptr, &wsum_pair_avx512<1>, &wsum_pair_avx512<2>, &wsum_pair_avx512<3>,
                                      &wsum_pair_avx512<4>};
  const int64_t fused = dim / 8 * 8;
  int64_t j = 0;
  for (; j + 2 <= nq; j += 2) {
    const float *p0 = p + j * ld, *p1 = p0 + ld;
    const float *v0 = head0 + (j / group) * head_floats, *v1 = head0 + ((j + 1) / group) * head_floats;
    float *a0 = acc + j * dim, *a1 = a0 + dim;
    int64_t d = 0;
    for (; d + 64 <= fused; d += 64) wsum_pair_avx512<4>(p0, v0 + d, a0 + d, p1, v1 + d, a1 + d, n, dim, 0xFFFF);
    if (d < fused) {
      const int64_t rest = fused - d;  // a multiple of 8 below 64
      pairs[(rest + 15) / 16](p0, v0 + d, a0 + d, p1, v1 + d, a1 + d, n, dim, rest % 16 == 0 ? 0xFFFF : 0x00FF);
    }
    if (fused < dim) {
      wsum_tail(p0, v0, n, dim, fused, a0);
      wsum_tail(p1, v1, n, dim, fused, a1);
    }
  }
  for (; j < nq; ++j) {
    const float* pj = p + j * ld;
    const float* values = head0 + (j / group) * head_floats;
    float* a = acc + j * dim;
    int64_t d = 0;
    for (; d + 64 <= fused; d += 64) wsum_chunk_avx512<4>(pj, values + d, n, dim, a + d, 0xFFFF);
    if (d < fused) {
      const int64_t rest = fused - d;  // a multiple of 8 below 64
      chunks[(rest + 15) / 16](pj, values + d, n, dim, a + d, rest % 16 == 0 ? 0xFFFF : 0x00FF);
    }
    if (fused < dim) wsum_tail(pj, values, n, dim, fused, a);
  }
}
#endif

const AttentionOps<>& attention_ops(Isa isa, int64_t dim) {
  static const AttentionOps<> portable{&scores_with<dot_portable>, &exp_shift_portable, &wsum_portable};
#ifdef HYFLOW_DECODE_X86
  static const AttentionOps<> avx2{&scores_with<dot_avx2>, &exp_shift_avx2, &wsum_avx2};
  static const AttentionOps<> avx512{&scores_avx512, &exp_shift_avx2, &wsum_avx512};
  // dot_avx512 covers dot_avx2's vector part only: dims with a scalar tail take dot_avx2 itself.
  static const AttentionOps<> avx512_tail{&scores_with<dot_avx2>, &exp_shift_avx2, &wsum_avx512};
  if (isa == Isa::kAvx512) return dim % 8 == 0 ? avx512 : avx512_tail;
  if (isa == Isa::kAvx2) return avx2;
#endif
  (void)isa;
  (void)dim;
  return portable;
}

// ---- bf16 KV (attend_rows_bf16) -----------------------------------------------------------
// Keys and values are bf16, widened to float32 exactly; q, the scores, the softmax, p and the
// weighted sums are float32. One arithmetic per build: the portable build's dot product is one
// chain over d in order, the AVX-512 build's 16 chains (d mod 16) summed by _mm512_reduce_add_ps;
// the weighted sum is, per dimension, acc = acc + p_i * v_i[d] in position order in both (the
// vector build with fma). The two builds agree to float32 rounding, not bit for bit.

void scores_bf16_portable(const float* q, int64_t nq, const uint16_t* keys, int64_t n, int64_t dim, float scale,
                          float* sc, int64_t ld, float* maxes) {
  for (int64_t j = 0; j < nq; ++j) {
    const float* qj = q + j * dim;
    float* sj = sc + j * ld;
    float max = maxes[j];
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t* key = keys + i * dim;
      float acc = 0.0F;
      for (int64_t d = 0; d < dim; ++d) acc += qj[d] * from_bf16(key[d]);
      sj[i] = acc / scale;
      max = std::max(max, sj[i]);
    }
    maxes[j] = max;
  }
}

void wsum_bf16_portable(const float* p, int64_t ld, int64_t nq, int64_t group, const uint16_t* values,
                        int64_t head_floats, int64_t n, int64_t dim, float* acc) {
  for (int64_t j = 0; j < nq; ++j) {
    const float* pj = p + j * ld;
    const uint16_t* head = values + (j / group) * head_floats;
    float* a = acc + j * dim;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t* vs = head + i * dim;
      for (int64_t d = 0; d < dim; ++d) a[d] += pj[i] * from_bf16(vs[d]);
    }
  }
}

#ifdef HYFLOW_DECODE_X86
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// 16 bf16 (the lanes of `mask`; 0 elsewhere) widened to float32.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load_bf16(const uint16_t* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void scores_bf16_avx512(const float* q, int64_t nq,
                                                                           const uint16_t* keys, int64_t n,
                                                                           int64_t dim, float scale, float* sc,
                                                                           int64_t ld, float* maxes) {
  const int64_t full = dim / 16 * 16;
  const auto tail = static_cast<__mmask16>((1U << (dim - full)) - 1U);
  for (int64_t j = 0; j < nq; ++j) {
    const float* qj = q + j * dim;
    float* sj = sc + j * ld;
    float max = maxes[j];
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t* key = keys + i * dim;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t d = 0; d < full; d += 16) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(qj + d), load_bf16(key + d, 0xFFFF), acc);
      }
      if (full < dim) acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, qj + full), load_bf16(key + full, tail), acc);
      sj[i] = _mm512_reduce_add_ps(acc) / scale;
      max = std::max(max, sj[i]);
    }
    maxes[j] = max;
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void wsum_bf16_avx512(const float* p, int64_t ld, int64_t nq,
                                                                         int64_t group, const uint16_t* values,
                                                                         int64_t head_floats, int64_t n, int64_t dim,
                                                                         float* acc) {
  for (int64_t j = 0; j < nq; ++j) {
    const float* pj = p + j * ld;
    const uint16_t* head = values + (j / group) * head_floats;
    float* a = acc + j * dim;
    for (int64_t d = 0; d < dim; d += 64) {  // up to 4 registers of accumulators per pass over the positions
      __m512 r[4];
      __mmask16 m[4];
      const int nv = static_cast<int>(std::min<int64_t>(4, (dim - d + 15) / 16));
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const int64_t left = dim - d - 16 * v;
        m[v] = left >= 16 ? static_cast<__mmask16>(0xFFFF) : left > 0 ? static_cast<__mmask16>((1U << left) - 1U) : 0;
        r[v] = v < nv ? _mm512_maskz_loadu_ps(m[v], a + d + 16 * v) : _mm512_setzero_ps();
      }
      for (int64_t i = 0; i < n; ++i) {
        const __m512 pi = _mm512_set1_ps(pj[i]);
        const uint16_t* vs = head + i * dim + d;
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          if (v < nv) r[v] = _mm512_fmadd_ps(pi, load_bf16(vs + 16 * v, m[v]), r[v]);
        }
      }
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        if (v < nv) _mm512_mask_storeu_ps(a + d + 16 * v, m[v], r[v]);
      }
    }
  }
}
#pragma GCC diagnostic pop

bool cpu_avx512bw() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return has;
}
#endif

// The bf16 KV ops: AVX-512 when the kernel build is AVX-512 (and the CPU has AVX-512 BW), else portable.
const AttentionOps<uint16_t>& attention_ops_bf16(Isa isa) {
  static const AttentionOps<uint16_t> portable{&scores_bf16_portable, &exp_shift_portable, &wsum_bf16_portable};
#ifdef HYFLOW_DECODE_X86
  static const AttentionOps<uint16_t> avx512{&scores_bf16_avx512, &exp_shift_avx2, &wsum_bf16_avx512};
  if (isa == Isa::kAvx512 && cpu_avx512bw()) return avx512;
#endif
  (void)isa;
  return portable;
}

template <class KV>
struct RowsAttention {
  const float* q;
  const KV *k, *v;
  const int32_t* const* tables;
  const int64_t* lengths;
  int64_t heads, kv_heads, dim, block_size;
  float* out;
};

// How far ahead of the work attend_rows fetches: about 12 KiB (three chunks of 16 positions at
// head_dim 64), enough to cover the memory latency at a core's share of the bandwidth.
constexpr int64_t kAttentionAheadBytes = 12288;

// A thread's work: units (row, kv head) [begin, end) in row-major order, taken as segments of one
// row's consecutive kv heads. Each segment reads its keys block by block (in a block, head by head),
// then its values the same way: the walk yields those runs ("chunks": one kv head's positions in one
// block) in that order, so that a second walk ahead of the work can fetch what comes next.
template <class KV>
struct Walk {
  const RowsAttention<KV>* a;
  int64_t unit, end;
  int64_t row = 0, g0 = 0, span = 0, len = 0;
  int kind = 2;  // 0: keys, 1: values, 2: between segments
  int64_t block = 0, pos = 0, head = 0;

  // The next segment (row, g0, span); false past the end.
  bool next_segment() {
    if (unit >= end) return false;
    row = unit / a->kv_heads;
    g0 = unit % a->kv_heads;
    span = std::min(a->kv_heads - g0, end - unit);
    unit += span;
    len = a->lengths[row];
    kind = 0;
    block = pos = head = 0;
    return true;
  }
  // The next chunk's first element and its elements; false past the end.
  bool next_chunk(const KV*& p, int64_t& floats) {
    for (;;) {
      if (kind == 2 && !next_segment()) return false;
      if (pos >= len) {
        if (++kind < 2) block = pos = head = 0;
        continue;
      }
      const int64_t n = std::min(a->block_size, len - pos), head_floats = a->block_size * a->dim;
      p = (kind == 0 ? a->k : a->v) +
          (static_cast<int64_t>(a->tables[row][block]) * a->kv_heads + g0 + head) * head_floats;
      floats = n * a->dim;
      if (++head == span) {
        head = 0;
        ++block;
        pos += n;
      }
      return true;
    }
  }
};

// Fetches the chunks a walk yields, a fixed number ahead of the work.
template <class KV>
struct Prefetcher {
  Walk<KV> walk;
  void fetch() {
    const KV* p = nullptr;
    int64_t floats = 0;
    if (walk.next_chunk(p, floats)) fetch_lines(p, floats * static_cast<int64_t>(sizeof(KV)));
  }
};

// Row `row`'s query heads of kv heads [g0, g0 + span). scratch: span * group * (length + 1) floats.
template <class KV>
void attend_segment(const AttentionOps<KV>& ops, const RowsAttention<KV>& a, int64_t row, int64_t g0, int64_t span,
                    float* scratch, Prefetcher<KV>& ahead) {
  const int64_t len = a.lengths[row];
  const int32_t* table = a.tables[row];
  const int64_t group = a.heads / a.kv_heads, dim = a.dim, bs = a.block_size;
  const int64_t nq = span * group, head_floats = bs * dim, block_floats = a.kv_heads * head_floats;
  const float* q = a.q + (row * a.heads + g0 * group) * dim;
  float* out = a.out + (row * a.heads + g0 * group) * dim;
  float* sc = scratch;  // (nq, len)
  float* maxes = scratch + nq * len;
  std::fill(maxes, maxes + nq, -std::numeric_limits<float>::infinity());
  const float scale = std::sqrt(static_cast<float>(dim));
  auto at = [&](const KV* base, int64_t b) {
    return base + static_cast<int64_t>(table[b]) * block_floats + g0 * head_floats;
  };
  for (int64_t b = 0, s = 0; s < len; ++b) {
    const int64_t n = std::min(bs, len - s);
    const KV* keys = at(a.k, b);
    for (int64_t g = 0; g < span; ++g) {
      ahead.fetch();
      ops.scores(q + g * group * dim, group, keys + g * head_floats, n, dim, scale, sc + g * group * len + s, len,
                 maxes + g * group);
    }
    s += n;
  }
  for (int64_t j = 0; j < nq; ++j) {
    float* p = sc + j * len;
    const float total = ops.exp_shift(p, len, maxes[j]);
    for (int64_t s = 0; s < len; ++s) p[s] = p[s] / total;
  }
  std::fill(out, out + nq * dim, 0.0F);
  for (int64_t b = 0, s = 0; s < len; ++b) {
    const int64_t n = std::min(bs, len - s);
    const KV* values = at(a.v, b);
    for (int64_t g = 0; g < span; g += 2) {  // two kv heads (their query heads) per call
      const int64_t m = std::min<int64_t>(2, span - g);
      for (int64_t t = 0; t < m; ++t) ahead.fetch();
      ops.wsum(sc + g * group * len + s, len, m * group, group, values + g * head_floats, head_floats, n, dim,
               out + g * group * dim);
    }
    s += n;
  }
}

template <class KV>
void attend_rows_impl(const AttentionOps<KV>& ops, const RowsAttention<KV>& a, int64_t rows) {
  // Units (row, kv head) in row-major order, split over the threads into contiguous runs of about
  // equal cost (positions read, plus a few for the per-unit work).
  const int64_t units = rows * a.kv_heads;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), units));
  thread_local std::vector<int64_t> bounds;
  bounds.assign(static_cast<size_t>(threads + 1), units);
  bounds[0] = 0;
  int64_t total = 0, max_len = 0;
  for (int64_t r = 0; r < rows; ++r) {
    total += (a.lengths[r] + 4) * a.kv_heads;
    max_len = std::max(max_len, a.lengths[r]);
  }
  for (int64_t u = 0, cost = 0, t = 1; u < units && t < threads; ++u) {
    while (t < threads && cost * threads >= total * t) bounds[static_cast<size_t>(t++)] = u;
    cost += a.lengths[u / a.kv_heads] + 4;
  }
  const int64_t group = a.heads / a.kv_heads;
  const int64_t chunk_bytes = a.block_size * a.dim * static_cast<int64_t>(sizeof(KV));
  const int64_t ahead_chunks = std::max<int64_t>(1, (kAttentionAheadBytes + chunk_bytes - 1) / chunk_bytes);
  const int64_t* bound = bounds.data();  // the caller's (bounds is per thread)
  parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> scratch;
    const size_t need = static_cast<size_t>(a.kv_heads * group * (max_len + 1));
    if (scratch.size() < need) scratch.resize(need);
    for (int64_t t = t0; t < t1; ++t) {
      Walk<KV> work{&a, bound[t], bound[t + 1]};
      Prefetcher<KV> ahead{Walk<KV>{&a, bound[t], bound[t + 1]}};
      for (int64_t i = 0; i < ahead_chunks; ++i) ahead.fetch();
      while (work.next_segment()) {
        attend_segment(ops, a, work.row, work.g0, work.span, scratch.data(), ahead);
      }
    }
  });
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

void advise_huge_pages(void* p, size_t bytes) {
#ifdef __linux__
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
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

uint16_t to_bf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<uint16_t>((bits >> 16) | 0x0040U);  // quiet NaN
  bits += 0x7FFFU + ((bits >> 16) & 1U);  // round to nearest even (overflow to inf as the hardware)
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x = 0.0F;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

bool cpu_has_bf16_dot() {
  return cpu_bf16_dot();
}

bool bf16_dot_enabled() {
  return cpu_bf16_dot() && g_bf16_dot_allowed.load(std::memory_order_relaxed);
}

void allow_bf16_dot(bool allow) {
  g_bf16_dot_allowed.store(allow);
}

int64_t packed_bf16_words(int64_t in, int64_t out) {
  return (out + kPanel - 1) / kPanel * kPanel * ((in + 1) / 2);
}

void pack_weight_bf16(const float* w, int64_t in, int64_t out, uint32_t* packed) {
  const int64_t panels = (out + kPanel - 1) / kPanel, in2 = (in + 1) / 2;
  parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint32_t* dst = packed + p * in2 * kPanel;
      for (int64_t j = 0; j < kPanel; ++j) {
        const int64_t o = p * kPanel + j;
        const float* row = o < out ? w + o * in : nullptr;
        for (int64_t kp = 0; kp < in2; ++kp) {
          const int64_t k = 2 * kp;
          const uint32_t lo = row != nullptr ? to_bf16(row[k]) : 0U;
          const uint32_t hi = row != nullptr && k + 1 < in ? to_bf16(row[k + 1]) : 0U;
          dst[kp * kPanel + j] = lo | (hi << 16);
        }
      }
    }
  });
}

void linear_bf16(const float* x, int64_t ldx, int64_t rows, const uint32_t* packed, const float* bias, int64_t in,
                 int64_t out, float* y, int64_t ldy, bool accumulate) {
  if (rows <= 0 || out <= 0) return;
  const int64_t in2 = (in + 1) / 2;
  thread_local std::vector<uint32_t> xb;  // x's rows as bf16 pairs (the odd k's partner of a last k is 0)
  xb.resize(static_cast<size_t>(rows * in2));
  for (int64_t m = 0; m < rows; ++m) {
    const float* xr = x + m * ldx;
    uint32_t* dst = xb.data() + m * in2;
    int64_t kp = 0;
#ifdef HYFLOW_DECODE_X86
    // A pair word is its two bf16 in memory order (little endian): 16 floats make 8 words.
    if (current_isa() == Isa::kAvx512) {
      for (; 2 * kp + 16 <= in; kp += 8) to_bf16_16(xr + 2 * kp, reinterpret_cast<uint16_t*>(dst + kp));
    }
#endif
    for (; kp < in2; ++kp) {
      const int64_t k = 2 * kp;
      const uint32_t hi = k + 1 < in ? to_bf16(xr[k + 1]) : 0U;
      dst[kp] = static_cast<uint32_t>(to_bf16(xr[k])) | (hi << 16);
    }
  }
  linear_impl(bf16_shapes(bf16_dot_enabled()), xb.data(), in2, rows, packed, bias, in2, out, y, ldy, accumulate);
}

void attend(const float* q, const float* k, const float* v, const int32_t* blocks, int64_t block_size,
            int64_t block_stride, int64_t stride, int64_t length, int64_t dim, float* scores, float* out) {
  if (use_avx2()) {
    attend_impl<true>(q, k, v, blocks, block_size, block_stride, stride, length, dim, scores, out);
  } else {
    attend_impl<false>(q, k, v, blocks, block_size, block_stride, stride, length, dim, scores, out);
  }
}

void attend_rows(const float* q, const float* k, const float* v, const int32_t* const* tables, const int64_t* lengths,
                 int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size, float* out) {
  if (rows <= 0 || heads <= 0) return;
  const RowsAttention<float> a{q, k, v, tables, lengths, heads, kv_heads, dim, block_size, out};
  attend_rows_impl(attention_ops(current_isa(), dim), a, rows);
}

void attend_rows_bf16(const float* q, const uint16_t* k, const uint16_t* v, const int32_t* const* tables,
                      const int64_t* lengths, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                      int64_t block_size, float* out) {
  if (rows <= 0 || heads <= 0) return;
  const RowsAttention<uint16_t> a{q, k, v, tables, lengths, heads, kv_heads, dim, block_size, out};
  attend_rows_impl(attention_ops_bf16(current_isa()), a, rows);
}

void silu_mul(float* gate, const float* up, int64_t n) {
  // Chunks of whole 8-float vectors from the start, so that each element takes the path (vector or
  // scalar tail) it takes in one call over all n.
  const int64_t vectors = (n + 7) / 8;
  parallel_for(0, vectors, 2048, [&](int64_t v0, int64_t v1) {
    const int64_t i0 = v0 * 8, i1 = std::min(n, v1 * 8);
#ifdef HYFLOW_DECODE_X86
    if (current_isa() == Isa::kAvx512) return silu_mul_avx512(gate + i0, up + i0, i1 - i0);
    if (use_avx2()) return silu_mul_avx2(gate + i0, up + i0, i1 - i0);
#endif
    for (int64_t i = i0; i < i1; ++i) gate[i] = gate[i] / (1.0F + std::exp(-gate[i])) * up[i];
  });
}

double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void rms_norm_rows(const float* x, const int64_t* index, int64_t rows, const float* weight, int64_t d, float eps,
                   float* out) {
  constexpr int64_t kSide = 8;  // rows whose sums run side by side (independent add chains)
  const int64_t grain = std::max<int64_t>(kSide, 4096 / std::max<int64_t>(1, d));
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t j0 = r0; j0 < r1; j0 += kSide) {
      const int64_t m = std::min(kSide, r1 - j0);
      const float* in[kSide];
      double sum[kSide];
      for (int64_t j = 0; j < kSide; ++j) {
        in[j] = x + (index != nullptr ? index[j0 + std::min(j, m - 1)] : j0 + std::min(j, m - 1)) * d;
        sum[j] = 0.0;
      }
      // Each row's sum in order, as sum_squares; the rows past m repeat the last one.
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t j = 0; j < kSide; ++j) sum[j] += static_cast<double>(in[j][i]) * in[j][i];
      }
      for (int64_t j = 0; j < m; ++j) {
        const auto mean = static_cast<float>(sum[j] / static_cast<double>(d));
        const float r = 1.0F / std::sqrt(mean + eps);
        float* o = out + (j0 + j) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = weight[i] * (in[j][i] * r);
      }
    }
  });
}

int64_t argmax(const float* z, int64_t n) {
#ifdef HYFLOW_DECODE_X86
  if (current_isa() == Isa::kAvx512) {
    bool nan = false;
    const int64_t arg = argmax_avx512(z, n, nan);
    if (arg >= 0) return arg;
  }
#endif
  return std::max_element(z, z + n) - z;
}

}  // namespace hyflow::inference::decode
