#pragma once
// The token kernels on raw pointers: fused log-probs + entropy (forward and backward) and
// per-row sampling. One block of threads per row (the backward: several at small batch); rows
// are read in 16-byte vectors; no softmax is ever materialized.
//
// Every kernel exists twice, from the same source (cuda/src/kernels/*.cuh):
//   hyflow::cuda::kernels::host::*    the host build: a driver that runs the grid (rows) and
//                                     each block's threads sequentially, phase by phase; always
//                                     built, tested against the ATen reference in the normal suite;
//   hyflow::cuda::kernels::device::*  the CUDA build (nvcc, -DHYFLOW_CUDA=ON, target
//                                     hyflow::cuda_kernels): pointers into device memory,
//                                     asynchronous on `stream` (a cudaStream_t; nullptr is the
//                                     legacy default stream).
// This header needs neither ATen nor the CUDA headers.

#include <cstdint>

namespace hyflow::cuda::kernels {

/// Element type of logits and gradients.
enum class DType : int { f32 = 0, bf16 = 1, f16 = 2 };

/// Threads per row block on the device, and what the host driver emulates by default.
inline constexpr int kDefaultBlockThreads = 256;

/// Log-probs of chosen tokens and the entropy of rows of logits, z = logits / temperature:
///   log_prob[r] = z[r, label[r]] - logsumexp(z[r]),   entropy[r] = -sum softmax(z[r]) log softmax(z[r]).
/// One pass over each row (online max / log-sum-exp). A label outside [0, vocab) gives NaN.
/// Rows whose logits are all -inf give NaN (as log_softmax does); -inf entries elsewhere are
/// tokens of probability 0. `lse` and `mean_z` (sum softmax(z) z) are what the backward needs.
struct ScoresForward {
  const void* logits = nullptr;  ///< (rows, vocab) of `dtype`, row r at logits + r * row_stride
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;           ///< elements between rows (>= vocab)
  const int64_t* labels = nullptr;  ///< (rows,); nullptr: no log-probs
  float temperature = 1.0f;         ///< > 0
  float* log_probs = nullptr;       ///< (rows,) or nullptr
  float* entropy = nullptr;         ///< (rows,) or nullptr
  float* lse = nullptr;             ///< (rows,) or nullptr: logsumexp(z)
  float* mean_z = nullptr;          ///< (rows,) or nullptr: sum softmax(z) z
};

/// Gradient with respect to the logits of sum_r g_lp[r] log_prob[r] + g_ent[r] entropy[r]:
///   dlogits[r, j] = (g_lp[r] (onehot(label[r])_j - p_j) + g_ent[r] p_j (mean_z[r] - z_j)) / temperature,
/// p = softmax(z), from the `lse` and `mean_z` saved by the forward. Written in `dtype`.
struct ScoresBackward {
  const void* logits = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;
  const int64_t* labels = nullptr;  ///< nullptr when grad_log_probs is nullptr
  float temperature = 1.0f;
  const float* grad_log_probs = nullptr;  ///< (rows,) or nullptr (zero)
  const float* grad_entropy = nullptr;    ///< (rows,) or nullptr (zero)
  const float* lse = nullptr;             ///< (rows,)
  const float* mean_z = nullptr;          ///< (rows,), needed when grad_entropy is given
  void* grad_logits = nullptr;            ///< (rows, vocab) contiguous, of `dtype`
};

/// One token per row. Per-row settings come from the arrays when given, else from the scalar:
/// temperature 0 is greedy (argmax of the raw logits, ties to the lowest id); otherwise
/// z = logits / temperature, then top-k (keep z >= the k-th largest; k <= 0 or >= vocab keeps
/// all), top-p on what top-k kept (keep a token when the mass of the strictly more likely tokens
/// is below p: the smallest prefix reaching p, ties at its edge all kept), min-p (keep
/// p >= min_p * p_max), and a draw from softmax(z) over the kept tokens by an exponential race
/// whose noise is Philox4x32-10 keyed by (seed, row id, step, token): reproducible, and a row's
/// token does not depend on the other rows. A row with a NaN or no finite logit gets -1.
struct SampleArgs {
  const void* logits = nullptr;  ///< (rows, vocab) of `dtype`
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;
  const float* temperature = nullptr;  ///< (rows,) or nullptr: temperature_all
  float temperature_all = 1.0f;
  const int64_t* top_k = nullptr;  ///< (rows,) or nullptr: top_k_all
  int64_t top_k_all = -1;
  const float* top_p = nullptr;  ///< (rows,) or nullptr: top_p_all
  float top_p_all = 1.0f;
  const float* min_p = nullptr;  ///< (rows,) or nullptr: min_p_all
  float min_p_all = 0.0f;
  const int64_t* row_ids = nullptr;  ///< (rows,) or nullptr: the row index
  uint64_t seed = 0;
  uint64_t step = 0;
  const int64_t* steps = nullptr;  ///< (rows,) or nullptr: `step` for every row
  int64_t* tokens = nullptr;       ///< (rows,) out
};

/// The arithmetic every kernel shares, run where the kernels run (a self-check, not a token op):
/// Philox4x32-10 and the 16-bit conversions, element by element. A device test compares what
/// the device computes against answers that do not come from this code (Random123's published
/// vectors, ATen's conversions), so a fault of the device build cannot hide behind the host's.
struct PrimitiveArgs {
  int64_t n = 0;
  const uint32_t* philox_in = nullptr;  ///< (n, 6): counter words 0..3, key words 0..1; nullptr: skip
  uint32_t* philox_out = nullptr;       ///< (n, 4)
  const float* values = nullptr;        ///< (n,); nullptr: skip the conversions
  uint16_t* bf16 = nullptr;             ///< (n,): values rounded to bfloat16 (nearest even)
  uint16_t* f16 = nullptr;              ///< (n,): values rounded to float16 (nearest even)
  float* bf16_back = nullptr;           ///< (n,): bf16 widened back to float
  float* f16_back = nullptr;            ///< (n,): f16 widened back to float
};

namespace host {
/// Host build: runs on host pointers, rows one after another, each block's `block_threads`
/// threads (a power of two, 1..1024) emulated phase by phase. Same arithmetic as the device
/// at the same block size.
void scores_forward(const ScoresForward& args, int block_threads = kDefaultBlockThreads);
/// `segments`: blocks per row (the device picks them from its SM count at small batch); the
/// gradient is elementwise, so the result is the same for any number.
void scores_backward(const ScoresBackward& args, int block_threads = kDefaultBlockThreads, int segments = 1);
void sample(const SampleArgs& args, int block_threads = kDefaultBlockThreads);
void primitives(const PrimitiveArgs& args);
}  // namespace host

namespace device {
/// True when this build has the CUDA kernels (HYFLOW_CUDA) and the CUDA runtime sees a device.
/// Throws as device_count() does.
bool available();
/// Number of visible CUDA devices: 0 without the CUDA build, on a machine without a CUDA driver
/// (no libcuda.so.1, or only the toolkit's stub) or whose driver sees no device. Any other CUDA
/// error (a driver older than the runtime, a broken install) is a hyflow::Error naming it: a GPU
/// machine that cannot run the kernels must fail its tests, not skip them.
int device_count();
/// Peak DRAM (HBM) bandwidth of CUDA device `device` in bytes per second: its memory clock
/// (cudaDevAttrMemoryClockRate, kHz) x 2 transfers per clock x its bus width
/// (cudaDevAttrGlobalMemoryBusWidth) / 8, the roofline memory-bound kernels are measured against.
/// 0 without the CUDA build. Throws hyflow::Error naming a failing CUDA call.
double memory_bandwidth(int device);
/// CUDA build only: enqueue on `stream` (a cudaStream_t) for device pointers; asynchronous.
/// Throws hyflow::Error with the CUDA error string when the launch fails. `block_threads`: a
/// power of two in [1, 1024] (ValueError otherwise), the host build's parameter.
void scores_forward(const ScoresForward& args, void* stream, int block_threads = kDefaultBlockThreads);
void scores_backward(const ScoresBackward& args, void* stream, int block_threads = kDefaultBlockThreads);
void sample(const SampleArgs& args, void* stream, int block_threads = kDefaultBlockThreads);
void primitives(const PrimitiveArgs& args, void* stream);
}  // namespace device

}  // namespace hyflow::cuda::kernels
