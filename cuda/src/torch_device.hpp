#pragma once
// The adapter's one seam to LibTorch's CUDA side (implemented in torch_device.cpp, the only
// file that includes c10/cuda headers, and only when HYFLOW_TORCH_CUDA is set).

#include <ATen/core/Tensor.h>

#include <functional>

namespace hyflow::cuda::detail {

/// Runs `launch(stream)` with `tensor`'s device current and its current CUDA stream (a
/// cudaStream_t). Throws hyflow::Error in builds without a CUDA LibTorch.
void with_tensor_stream(const at::Tensor& tensor, const std::function<void(void* stream)>& launch);

}  // namespace hyflow::cuda::detail
