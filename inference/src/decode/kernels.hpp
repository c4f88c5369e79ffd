#pragma once
// The decode engine's CPU kernels on raw float32 pointers (internal to hyflow::inference). Each
// function picks the best build the CPU runs (function-level target attributes, checked once
// per process with __builtin_cpu_supports on x86; portable elsewhere): AVX-512 (the GEMM, a pass's
// attention, SiLU*up, argmax), AVX2+FMA, or portable C++.

#include <cstddef>
#include <cstdint>
#include <functional>

namespace hyflow::inference::decode {

/// The kernel builds, in order of preference.
enum class Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

/// The build in use: the CPU's best, capped by limit_kernel_isa.
Isa kernel_isa();
/// The CPU's best build.
Isa best_kernel_isa();
const char* isa_name(Isa isa);
/// Caps the build (tests compare them; benchmarks measure them); process-wide. kAvx512: no cap.
void limit_kernel_isa(Isa max);

/// f(chunk_begin, chunk_end) over [begin, end) in chunks of at least `grain`, on LibTorch's
/// intra-op threads (at::get_num_threads(); at::get_thread_num() inside f names the thread).
/// at::parallel_for itself, but compiled where OpenMP is on (inference/CMakeLists.txt): called
/// from a file built without OpenMP it would run the whole range on the calling thread.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f);

/// Asks for transparent huge pages over the 2 MiB-aligned part of [p, p + bytes) (Linux madvise; a hint
/// the kernel may ignore). For the KV pool, whose blocks a step reads at scattered places (a TLB miss
/// per 4 KiB page otherwise); call it before the memory is first touched.
void advise_huge_pages(void* p, size_t bytes);

/// Output columns per panel of a packed weight.
constexpr int64_t kPanel = 16;

/// Floats of the packed copy of an (out, in) weight: out rounded up to kPanel, times in.
int64_t packed_size(int64_t in, int64_t out);

/// Packs a torch Linear weight w (out, in), row-major, for linear(): panel p holds outputs
/// [16p, 16p + 16) k-major (packed[p * in * 16 + k * 16 + j] = w[16p + j, k]; zero past out).
void pack_weight(const float* w, int64_t in, int64_t out, float* packed);

/// y[m, o] (+)= x[m, :] . w[o, :] + bias[o] for m < rows, o < out, with w given packed
/// (pack_weight), x (rows, in) with row stride ldx, y (rows, out) with row stride ldy.
/// accumulate: y = y + (x.w + b) (a fused residual add, in the reference's order).
/// Every dot product is the chain acc = fma(x[k], w[k], acc) for k = 0 .. in - 1 from 0, whatever
/// the rows, the tile or the vector build (the portable build without a fast fma rounds the
/// product apart): results do not depend on the other rows of the call. A register tile is up to
/// 8 rows x 48 outputs (AVX-512) or 6 x 16 (AVX2); each group of panels is read from memory once per
/// call for all rows. Splits the output over parallel_for in equal runs of panels. One row (batch 1) runs
/// a GEMV instead (AVX-512 and AVX2 builds; same chains, same results): 8 panels side by side, each 4 KiB
/// ahead fetched into L2 and, at a group's end, the next group's first lines (docs/inference.md).
void linear(const float* x, int64_t ldx, int64_t rows, const float* packed, const float* bias, int64_t in, int64_t out,
            float* y, int64_t ldy, bool accumulate);

/// bf16 (the top half of a float32) of x, rounded to nearest even; a NaN stays a quiet NaN.
uint16_t to_bf16(float x);
/// The float32 a bf16 stands for (exact).
float from_bf16(uint16_t b);

/// Whether the CPU has AVX-512 BF16 (vdpbf16ps: bf16 pair products summed in float32).
bool cpu_has_bf16_dot();
/// Whether linear_bf16 runs vdpbf16ps: the CPU has it and it is allowed (the environment variable
/// HYFLOW_DECODE_BF16=portable disallows it at start-up; allow_bf16_dot sets it, process-wide). Else the
/// portable build: bf16 -> float32, then the same products and sums in plain float arithmetic.
bool bf16_dot_enabled();
void allow_bf16_dot(bool allow);

/// 32-bit words of the bf16 packed copy of an (out, in) weight: out rounded up to kPanel, times ceil(in / 2).
int64_t packed_bf16_words(int64_t in, int64_t out);

/// Packs w (out, in), row-major float32, as bf16 for linear_bf16: panel p holds outputs [16p, 16p + 16),
/// one word per (pair of k, output): packed[p * ceil(in / 2) * 16 + (k / 2) * 16 + j] has bf16(w[16p + j, k])
/// in its low half and bf16(w[16p + j, k + 1]) in its high half (k even; zero past in and out): the
/// operand layout of vdpbf16ps.
void pack_weight_bf16(const float* w, int64_t in, int64_t out, uint32_t* packed);

/// linear() on a bf16 packed weight (pack_weight_bf16), the batch-1 GEMV included (vdpbf16ps build): x's
/// rows are rounded to bf16 (16 at a time in the AVX-512 build, the same arithmetic as to_bf16), the products
/// summed in float32, bias and the residual add (accumulate) in float32. Every output is the chain, per
/// pair of k in order from 0, acc = acc + x[k+1] w[k+1], then acc = acc + x[k] w[k] (each product exact,
/// each add rounded): vdpbf16ps's definition, computed with it (bf16_dot_enabled) or in plain float
/// arithmetic; the two agree except where an input or a partial sum is a float32 denormal (the hardware
/// flushes those to 0).
void linear_bf16(const float* x, int64_t ldx, int64_t rows, const uint32_t* packed, const float* bias, int64_t in,
                 int64_t out, float* y, int64_t ldy, bool accumulate);

/// One query head's attention over `length` cached positions of a paged cache: position s
/// lives in block blocks[s / block_size] at offset s % block_size; its key starts at
/// k + block * block_stride + offset * stride (v likewise). scores: length floats of scratch.
/// out[d] = sum_s softmax(q.k_s / sqrt(dim))_s v_s[d], summed in position order. The AVX2 build's
/// exp is a polynomial within 2 ulp (exp_avx2 in kernels.cpp), the portable build's std::exp.
void attend(const float* q, const float* k, const float* v, const int32_t* blocks, int64_t block_size,
            int64_t block_stride, int64_t stride, int64_t length, int64_t dim, float* scores, float* out);

/// attend() for every row r < rows and query head h < heads of a pass, bit for bit, over a paged
/// cache of (block, kv head, position in block, dim): position s of row r lies in block
/// tables[r][s / block_size]; its key starts at k + ((block * kv_heads + kv) * block_size + s % block_size) * dim
/// (v likewise), kv = h / (heads / kv_heads). Row r attends to its first lengths[r] positions; q and
/// out are (rows, heads * dim). Only the order memory is read in differs from attend() per (row, head):
/// a row's kv heads are walked block by block (each block's heads one contiguous run, fetched ahead),
/// each key read once for its GQA group's query heads; (row, kv head) units split over parallel_for
/// in contiguous runs of about equal positions.
void attend_rows(const float* q, const float* k, const float* v, const int32_t* const* tables, const int64_t* lengths,
                 int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size, float* out);

/// attend_rows() over a bf16 cache (keys and values stored as to_bf16 of the float32 ones, same
/// layout): each key and value widened to float32 exactly, the scores, softmax and weighted sums in
/// float32. Its own arithmetic (not attend()'s): one in-order chain per dot product in the portable
/// build, 16 chains summed at the end in the AVX-512 build (used when the kernel build is AVX-512 and
/// the CPU has AVX-512 BW); the weighted sum in position order in both. The builds agree to float32
/// rounding.
void attend_rows_bf16(const float* q, const uint16_t* k, const uint16_t* v, const int32_t* const* tables,
                      const int64_t* lengths, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                      int64_t block_size, float* out);

/// gate[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up (SwiGLU's product), split over
/// parallel_for; the AVX-512 build computes the AVX2 build's values.
void silu_mul(float* gate, const float* up, int64_t n);

/// Sum of squares of x[0..n) in double, in order (RMSNorm's mean of squares).
double sum_squares(const float* x, int64_t n);

/// RMSNorm of rows of d floats: out row j = weight * (x_i * (1 / sqrt(mean + eps))) with x_i the
/// row index[j] of x (row j when index is null) and mean = float(sum_squares(x_i, d) / d): the
/// reference's order of operations. Rows split over parallel_for; 8 rows' sums run side by side.
void rms_norm_rows(const float* x, const int64_t* index, int64_t rows, const float* weight, int64_t d, float eps,
                   float* out);

/// std::max_element(z, z + n) - z: the first maximum (vectorized in the AVX-512 build; std::max_element
/// itself where z holds a NaN).
int64_t argmax(const float* z, int64_t n);

}  // namespace hyflow::inference::decode
