// The decode engine's one look at a device's memory (DecodeEngineOptions::memory_info's default),
// and vLLM's KV budget rule. Only this file includes LibTorch's CUDA headers, and only where
// HYFLOW_TORCH_CUDA is 1 (inference/CMakeLists.txt); elsewhere CUDA tensors cannot exist.
#include <hyflow/core/error.hpp>
#include <hyflow/inference/decode_engine.hpp>

#if HYFLOW_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cmath>
#include <string>

namespace hyflow::inference {

DeviceMemory cuda_device_memory(const c10::Device& device) {
#if HYFLOW_TORCH_CUDA
  if (!device.is_cuda()) throw ValueError("cuda_device_memory: " + device.str() + " is not a CUDA device");
  const c10::cuda::CUDAGuard guard(device);
  // Blocks LibTorch caches but does not use would count as in use: hand them back first.
  c10::cuda::CUDACachingAllocator::emptyCache();
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return DeviceMemory{static_cast<int64_t>(free), static_cast<int64_t>(total)};
#else
  throw Error("cuda_device_memory: asked about " + device.str() +
              ", but this build has no CUDA LibTorch (-DHYFLOW_CUDA=ON with a CUDA LibTorch)");
#endif
}

int64_t kv_budget_bytes(double gpu_memory_utilization, const DeviceMemory& memory, int64_t held) {
  if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0)) {
    throw ValueError("gpu_memory_utilization must be in (0, 1], got " + std::to_string(gpu_memory_utilization));
  }
  if (memory.total <= 0 || memory.free < 0 || memory.free > memory.total || held < 0) {
    throw ValueError("device memory report out of range: free " + std::to_string(memory.free) + " of " +
                     std::to_string(memory.total) + " bytes, pool held " + std::to_string(held));
  }
  const int64_t in_use = std::max<int64_t>(0, memory.total - memory.free - held);
  const auto allowed = static_cast<int64_t>(std::floor(gpu_memory_utilization * static_cast<double>(memory.total)));
  const int64_t budget = allowed - in_use;
  if (budget <= 0) {
    throw ValueError("no device memory left for the KV cache: gpu_memory_utilization " +
                     std::to_string(gpu_memory_utilization) + " x " + std::to_string(memory.total) +
                     " bytes = " + std::to_string(allowed) + " bytes, but " + std::to_string(in_use) +
                     " bytes are already in use (raise gpu_memory_utilization or free memory)");
  }
  return budget;
}

}  // namespace hyflow::inference
