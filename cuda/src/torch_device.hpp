#pragma once
// The adapter's one seam to LibTorch's CUDA side (implemented in torch_device.cpp, the only
// file that includes c10/cuda headers, and only when HYFLOW_TORCH_CUDA is set), and what the
// log-prob and sampling adapters share.

#include <hyflow/cuda/kernels.hpp>

#include <ATen/core/Tensor.h>

#include <functional>

namespace hyflow::cuda::detail {

/// Runs `launch(stream)` with `tensor`'s device current and its current CUDA stream (a
/// cudaStream_t). Throws hyflow::Error in builds without a CUDA LibTorch.
void with_tensor_stream(const at::Tensor& tensor, const std::function<void(void* stream)>& launch);

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

}  // namespace hyflow::cuda::detail
