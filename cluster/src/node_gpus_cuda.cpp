// The GPUs a caf-node advertises, from the CUDA runtime (compiled only with HYFLOW_CUDA).
#include "node_gpus.hpp"

#include <cuda_runtime_api.h>

namespace hyflow::cluster::detail {

void fill_cuda_devices(NodeInfo& info) {
  info.gpu_names.clear();
  info.gpu_memory_bytes.clear();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {  // no driver or no device: a CPU node
    cudaGetLastError();                             // clear the sticky error state
    count = 0;
  }
  info.gpus = count;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      cudaGetLastError();
      info.gpu_names.push_back("cuda:" + std::to_string(i) + " (properties unavailable)");
      info.gpu_memory_bytes.push_back(0);
      continue;
    }
    info.gpu_names.emplace_back(prop.name);
    info.gpu_memory_bytes.push_back(static_cast<int64_t>(prop.totalGlobalMem));
  }
}

}  // namespace hyflow::cluster::detail
