// The one place that knows whether LibTorch has CUDA. cuda/CMakeLists.txt defines
// HYFLOW_TORCH_CUDA=1 when hyflow is configured with -DHYFLOW_CUDA=ON and LibTorch was built
// with CUDA (a GPU machine's LibTorch 2.x); with Debian's CPU LibTorch it is 0 and CUDA
// tensors cannot exist, so the adapter never gets here.
#include "torch_device.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/cuda/dispatch.hpp>

#include <string>

#include <hyflow/core/torch_compat.hpp>

#if HYFLOW_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace hyflow::cuda {

bool device_kernels_built() {
  return HYFLOW_TORCH_CUDA != 0;
}

bool uses_kernels(Impl impl, const at::Device& device) {
  switch (impl) {
    case Impl::kernel:
      return true;
    case Impl::reference:
      return false;
    case Impl::by_device:
      return device.is_cuda() && device_kernels_built();
  }
  return false;
}

namespace detail {

void require_kernel_device(const at::Tensor& t, const char* op) {
  if (t.device().is_cpu() || (t.is_cuda() && device_kernels_built())) return;
  throw ValueError(std::string(op) + ": a tensor on " + t.device().str() +
                   " cannot run the token kernels: this build has " +
                   (device_kernels_built() ? "them for CPU and CUDA tensors only"
                                           : "no CUDA kernels for tensors (configure -DHYFLOW_CUDA=ON against a "
                                             "LibTorch with CUDA, docs/gpu.md)"));
}

void with_tensor_stream(const at::Tensor& tensor, const char* op, const std::function<void(void* stream)>& launch) {
#if HYFLOW_TORCH_CUDA
  (void)op;
  const c10::cuda::CUDAGuard guard(tensor.device());
  launch(torch_compat::current_stream(tensor.device().index()));
#else
  (void)launch;
  require_kernel_device(tensor, op);
  throw ValueError(std::string(op) + ": tensor on " + tensor.device().str() + " needs the CUDA kernels");
#endif
}

}  // namespace detail
}  // namespace hyflow::cuda
