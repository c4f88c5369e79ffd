#pragma once
// The adapter's one seam to LibTorch's CUDA side (implemented in torch_device.cpp, the only
// file that includes c10/cuda headers, and only when HYFLOW_TORCH_CUDA is set), and what the
// log-prob and sampling adapters share: the kernels' dtypes, their common arguments and the
// one host/device launch branch.

#include <hyflow/cuda/kernels.hpp>

#include <ATen/core/Tensor.h>

#include <functional>

namespace hyflow::cuda::detail {

/// Runs `launch(stream)` with `tensor`'s device current and its current CUDA stream (a
/// cudaStream_t). Throws hyflow::ValueError naming `op` in builds without a CUDA LibTorch.
void with_tensor_stream(const at::Tensor& tensor, const char* op, const std::function<void(void* stream)>& launch);

/// Throws hyflow::ValueError naming `op` and the device unless the kernels can run where `t`
/// lives: the host build for CPU tensors, the device build for CUDA tensors when this build has
/// it. Anything else would reach the host build with memory it cannot read, or a host copy.
void require_kernel_device(const at::Tensor& t, const char* op);

/// True when the kernels read `t`'s dtype as it is: float32, bfloat16 or float16.
inline bool is_kernel_dtype(const at::Tensor& t) {
  const auto type = t.scalar_type();
  return type == at::kFloat || type == at::kBFloat16 || type == at::kHalf;
}

/// The kernels' dtype of a logits tensor (bf16, f16; float32 for everything else).
inline kernels::DType kernel_dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16:
      return kernels::DType::bf16;
    case at::kHalf:
      return kernels::DType::f16;
    default:
      return kernels::DType::f32;
  }
}

/// A kernel's arguments (ScoresForward, ScoresBackward, SampleArgs) with the fields they all
/// share set from `logits`: (rows, vocab), contiguous, of a kernel dtype.
template <class Args>
Args logits_args(const at::Tensor& logits) {
  Args args;
  args.logits = logits.data_ptr();
  args.dtype = kernel_dtype_of(logits);
  args.rows = logits.size(0);
  args.vocab = logits.size(1);
  args.row_stride = logits.size(1);
  return args;
}

/// Runs a token kernel where `tensor` lives: `device` (the nvcc build) on the tensor's current
/// CUDA stream for a CUDA tensor, `host` (the host build, default block size) for a CPU tensor;
/// any other device is refused by name (require_kernel_device).
template <class Args>
void launch(const at::Tensor& tensor, const char* op, const Args& args, void (*host)(const Args&, int),
            void (*device)(const Args&, void*, int)) {
  require_kernel_device(tensor, op);
  if (tensor.is_cuda()) {
    with_tensor_stream(tensor, op, [&](void* stream) { device(args, stream, kernels::kDefaultBlockThreads); });
  } else {
    host(args, kernels::kDefaultBlockThreads);
  }
}

}  // namespace hyflow::cuda::detail
