#pragma once
// Building blocks shared by the token kernels, compiled twice: by nvcc for the device
// (kernels_device.cu) and by the host C++ compiler for the host build (kernels_host.cpp), which
// the normal test suite checks against the ATen reference. Everything here is plain arithmetic
// on floats and integers: no CUDA headers, no ATen.
//
// A kernel body is written once against an execution policy `Exec` (one block per row):
//   ex.threads()          threads per block (a power of two)
//   ex.for_threads(f)     f(t) for this thread (device) or for t = 0..threads()-1 in order (host)
//   ex.sync()             __syncthreads() on the device; nothing on the host, where each phase
//                         has already run for every thread when for_threads returns
//   ex.single(f)          f() on thread 0 only
//   ex.shared<T>(n)       n elements of block-shared memory (bump allocation, same on every thread)
//   ex.atomic_add(p, v)   integer atomic add (host: plain add; integers make the order irrelevant)
//   ex.fetch_add(p, v)    the same, returning the value before (slots handed out in any order:
//                         only order-free results may depend on them)
// Values that cross a barrier live in shared memory, never in locals, so the host driver, which
// runs each phase for all threads before the next, computes what the device computes.

#include <math.h>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define HYFLOW_HD __host__ __device__ __forceinline__
#else
#define HYFLOW_HD inline
#endif

namespace hyflow::cuda::kernels::detail {

HYFLOW_HD float plus_inf() {
  return HUGE_VALF;
}
HYFLOW_HD float minus_inf() {
  return -HUGE_VALF;
}

HYFLOW_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

HYFLOW_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

HYFLOW_HD bool is_nan(float f) {
  return f != f;
}

// --- 16-bit floats, by bit manipulation (the same code on host and device) ----------------

HYFLOW_HD float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

HYFLOW_HD uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

HYFLOW_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

HYFLOW_HD uint16_t float_to_f16(float f) {  // round to nearest even
  uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {                                               // below 2^-14: subnormal
    const float scaled = bits_float(x) * 16777216.0f;                  // exact: times 2^24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(rintf(scaled)));
  }
  x += 0xfffu + ((x >> 13) & 1u);
  x -= 0x38000000u;  // exponent bias 127 -> 15
  return static_cast<uint16_t>(sign | (x >> 13));
}

/// Element types of logits and gradients (the values of hyflow::cuda::kernels::DType).
enum class Elem : int { f32 = 0, bf16 = 1, f16 = 2 };

HYFLOW_HD float load(const void* base, Elem type, int64_t i) {
  switch (type) {
    case Elem::bf16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case Elem::f16:
      return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

/// Elements per 16-byte vector: 4 float32, 8 bf16 or f16.
HYFLOW_HD int vec_elems(Elem type) {
  return type == Elem::f32 ? 4 : 8;
}

#if defined(__CUDA_ARCH__)
/// f(j0 + i, element i) for the elements of one 16-byte vector, in order (little-endian halves).
template <class F>
__device__ __forceinline__ void apply_vector(const uint4& v, Elem type, int64_t j0, F& f) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  if (type == Elem::f32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f(j0 + i, __uint_as_float(words[i]));
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const auto h = static_cast<uint16_t>(words[i >> 1] >> ((i & 1) * 16));
      f(j0 + i, type == Elem::bf16 ? bf16_to_float(h) : f16_to_float(h));
    }
  }
}
#endif

/// f(j, x) for the elements [0, n) of a row that thread t of `threads` owns, in the order every
/// backend uses: 16-byte vectors c = t, t + threads, t + 2 threads, ... (vec_elems elements each,
/// in order), then the elements past the last whole vector, j = whole + t, whole + t + threads,
/// .... On the device a vector is one 16-byte load when `base` is 16-byte aligned, two vectors in
/// flight at a time; otherwise, and in the host build, the same elements are loaded one by one.
/// The values and their order are the same either way, so results do not depend on alignment.
template <class F>
HYFLOW_HD void for_row(int t, int threads, const void* base, Elem type, int64_t n, F&& f) {
  const int w = vec_elems(type);
  const int64_t vectors = n / w, step = threads;
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(base) & 15u) == 0) {
    const uint4* v = static_cast<const uint4*>(base);
    int64_t c = t;
    for (; c + step < vectors; c += 2 * step) {
      const uint4 first = v[c], second = v[c + step];  // both loads issued before either is used
      apply_vector(first, type, c * w, f);
      apply_vector(second, type, (c + step) * w, f);
    }
    if (c < vectors) apply_vector(v[c], type, c * w, f);
  } else
#endif
  {
    for (int64_t c = t; c < vectors; c += step)
      for (int i = 0; i < w; ++i) f(c * w + i, load(base, type, c * w + i));
  }
  for (int64_t j = vectors * w + t; j < n; j += step) f(j, load(base, type, j));
}

HYFLOW_HD void store(void* base, Elem type, int64_t i, float v) {
  switch (type) {
    case Elem::bf16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(v);
      break;
    case Elem::f16:
      static_cast<uint16_t*>(base)[i] = float_to_f16(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
  }
}

// --- order-preserving keys: a < b as floats <=> key(a) < key(b) as unsigned (no NaN) ----------

HYFLOW_HD uint32_t order_key(float f) {
  const uint32_t u = float_bits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// --- Philox4x32-10 (Salmon et al., SC'11): a counter-based generator ----------------------

struct Philox4 {
  uint32_t v[4];
};

HYFLOW_HD Philox4 philox4x32_10(Philox4 counter, uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * counter.v[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * counter.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    counter = Philox4{{hi1 ^ counter.v[1] ^ key0, lo1, hi0 ^ counter.v[3] ^ key1, lo0}};
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
  return counter;
}

/// The four random words for tokens 4g..4g+3 of one row at one step: counter (g, row id, step),
/// key = seed. A row's draws depend on (seed, row id, step, token) only, never on its batch.
HYFLOW_HD Philox4 token_randoms(uint64_t seed, uint64_t row_id, uint64_t step, uint64_t group) {
  const Philox4 counter{{static_cast<uint32_t>(group), static_cast<uint32_t>(row_id),
                         static_cast<uint32_t>(row_id >> 32) ^ static_cast<uint32_t>(group >> 32),
                         static_cast<uint32_t>(step)}};
  return philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// A uniform in [2^-24, 1 - 2^-24] from 23 random bits (never 0 or 1, so logs stay finite).
HYFLOW_HD float uniform_open(uint32_t bits) {
  return (static_cast<float>(bits >> 9) + 0.5f) * 1.1920928955078125e-7f;
}

/// The race key of a token: z - log(E) with E ~ Exp(1) from `bits`. The argmax of the keys over
/// the kept tokens is a draw from softmax(z) restricted to them (the exponential race).
HYFLOW_HD float race_key(float z, uint32_t bits) {
  return z - logf(-logf(uniform_open(bits)));
}

// --- online softmax statistics --------------------------------------------------------------

/// Statistics of a set of logits z: m = max z, s = sum exp(z - m), t = sum exp(z - m) (z - m).
/// Then logsumexp = m + log s, the mean of z under softmax is m + t / s, and the entropy is
/// log s - t / s. -inf entries contribute nothing; a NaN makes every result NaN.
struct SoftmaxStats {
  float m;
  float s;
  float t;
};

HYFLOW_HD SoftmaxStats empty_stats() {
  return SoftmaxStats{minus_inf(), 0.0f, 0.0f};
}

HYFLOW_HD void push(SoftmaxStats& a, float z) {
  if (z == minus_inf()) return;
  if (z > a.m) {
    if (a.m == minus_inf()) {
      a = SoftmaxStats{z, 1.0f, 0.0f};
      return;
    }
    const float d = a.m - z;  // < 0
    const float f = expf(d);
    a.t = f * (a.t + d * a.s);
    a.s = a.s * f + 1.0f;
    a.m = z;
    return;
  }
  const float d = z - a.m;  // <= 0, or NaN
  const float e = expf(d);
  a.s += e;
  a.t += e * d;
}

HYFLOW_HD SoftmaxStats merge(SoftmaxStats a, SoftmaxStats b) {
  if (b.m == minus_inf() && b.s == 0.0f) return a;
  if (a.m == minus_inf() && a.s == 0.0f) return b;
  const float m = a.m > b.m ? a.m : b.m;
  const float da = a.m - m, db = b.m - m;
  const float fa = expf(da), fb = expf(db);
  return SoftmaxStats{m, a.s * fa + b.s * fb, fa * (a.t + da * a.s) + fb * (b.t + db * b.s)};
}

/// A candidate for an argmax: larger value wins, ties go to the lower index.
struct ArgMax {
  float value;
  int64_t index;
};

HYFLOW_HD ArgMax better(ArgMax a, ArgMax b) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

/// Tree reduction of per-thread partials part[0..threads) into part[0], the same order on host
/// and device: level by level, part[t] = combine(part[t], part[t + stride]).
template <class Exec, class V, class F>
HYFLOW_HD void tree_reduce(Exec& ex, V* part, F combine) {
  for (int stride = ex.threads() / 2; stride > 0; stride /= 2) {
    ex.for_threads([&](int t) {
      if (t < stride) part[t] = combine(part[t], part[t + stride]);
    });
    ex.sync();
  }
}

}  // namespace hyflow::cuda::kernels::detail
