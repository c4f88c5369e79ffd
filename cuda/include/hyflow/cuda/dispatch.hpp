#pragma once
// Which implementation a token op runs: the tensor adapters in sampling.hpp and log_probs.hpp
// dispatch on the tensor's device unless told otherwise.

#include <ATen/core/Tensor.h>

namespace hyflow::cuda {

enum class Impl {
  /// CUDA tensors: the CUDA kernels when this build has them (HYFLOW_CUDA with a CUDA LibTorch),
  /// the ATen reference otherwise; CPU tensors: the ATen reference.
  by_device,
  /// The ATen reference (what CPU tensors use).
  reference,
  /// The kernels: on the device for CUDA tensors, the host build (kernels.hpp) for CPU tensors.
  kernel,
};

/// True when CUDA tensors go to the CUDA kernels under Impl::by_device: built with
/// -DHYFLOW_CUDA=ON against a LibTorch with CUDA.
bool device_kernels_built();

/// True when `impl` on a tensor on `device` runs the kernels (device or host build).
bool uses_kernels(Impl impl, const at::Device& device);

}  // namespace hyflow::cuda
