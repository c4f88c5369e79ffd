#pragma once
// Internal: what a caf-node advertises about its GPUs. Defined in node_gpus_cuda.cpp, which
// is compiled only with HYFLOW_CUDA (the CUDA runtime); without it node_info.cpp reports
// LibTorch's device count and no names or memory.

#include <hyflow/cluster/node_info.hpp>

namespace hyflow::cluster::detail {

/// Fills info.gpus, info.gpu_names and info.gpu_memory_bytes from cudaGetDeviceCount and
/// cudaGetDeviceProperties (name, totalGlobalMem); no devices (or no driver) gives 0.
void fill_cuda_devices(NodeInfo& info);

}  // namespace hyflow::cluster::detail
