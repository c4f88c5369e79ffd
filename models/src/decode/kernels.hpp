#pragma once
// The decode engine's CPU kernels on raw float32 pointers (internal to hyflow::models). Each
// function picks, once per process, an AVX2+FMA build (function-level target attributes) or a
// portable one (runtime check with __builtin_cpu_supports on x86, portable elsewhere).

#include <cstdint>

namespace hyflow::models::decode {

/// Whether the AVX2+FMA kernels run on this CPU (false: the portable ones).
bool avx2_kernels();
/// Forces the portable kernels (tests compare both builds); process-wide.
void force_portable_kernels(bool on);

/// y[m, o] (+)= x[m, :] . w[o, :] + bias[o] for m < rows, o < out. w is (out, in) row-major
/// (a torch Linear weight), x (rows, in) with row stride ldx, y (rows, out) with row stride
/// ldy. accumulate: y = y + (x.w + b) (a fused residual add, in the reference's order).
/// Each weight row is read from memory once per call for all rows (tiles of 4 weight rows
/// times up to 3 activation rows in registers). Splits the output over at::parallel_for.
void linear(const float* x, int64_t ldx, int64_t rows, const float* w, const float* bias, int64_t in, int64_t out,
            float* y, int64_t ldy, bool accumulate);

/// One query head's attention over `length` cached positions of a paged cache: position s
/// lives in block blocks[s / block_size] at offset s % block_size; its key starts at
/// k + (block * block_size + offset) * stride (v likewise). scores: length floats of scratch.
/// out[d] = sum_s softmax(q.k_s / sqrt(dim))_s v_s[d]. The AVX2 build's exp is a polynomial
/// within 2 ulp (exp_avx2 in kernels.cpp), the portable build's std::exp.
void attend(const float* q, const float* k, const float* v, const int32_t* blocks, int64_t block_size, int64_t stride,
            int64_t length, int64_t dim, float* scores, float* out);

/// gate[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up (SwiGLU's product).
void silu_mul(float* gate, const float* up, int64_t n);

/// Sum of squares of x[0..n) in double (RMSNorm's mean of squares).
double sum_squares(const float* x, int64_t n);

}  // namespace hyflow::models::decode
