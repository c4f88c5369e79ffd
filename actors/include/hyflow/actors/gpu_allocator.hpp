#pragma once
// The GPUs of the hosts a runtime places workers on (this process in-process, each caf-node on
// a cluster), handed out to resource pools without overlap: two pools on one host (the
// training pool and a separate rollout pool, or several in-process "nodes") get disjoint device
// indices. Colocated roles share their pool's devices: draw a pool once and give that pool to
// every group that should share them.
//
//   GpuAllocator gpus({{"this process", 4}});
//   gpus.assign(global, "global", {0, 0});  // two in-process nodes of 2: cuda:0, 1 and cuda:2, 3
//   gpus.assign(rollout, "rollout", {0});   // ValueError naming 'global' and 'rollout'

#include <hyflow/actors/resource_pool.hpp>

#include <string>
#include <vector>

namespace hyflow::actors {

class GpuAllocator {
 public:
  struct Host {
    std::string name;  ///< how errors name it: "this process", a caf-node's address
    int gpus = 0;      ///< the CUDA devices it offers (logical indices 0 .. gpus - 1)
  };

  explicit GpuAllocator(std::vector<Host> hosts);

  /// Gives `pool` its devices (ResourcePool::set_devices): node i of the pool takes
  /// pool.store()[i] of the lowest free devices of host host_of_node[i] (host i when the list
  /// is empty). A CPU pool (use_gpu false) is left as it is. When a host has too few free
  /// devices, nothing is taken and a ValueError names the host, its device count, the pools
  /// holding its devices and `pool_name`; an unknown host index is a ValueError too.
  void assign(ResourcePool& pool, const std::string& pool_name, const std::vector<size_t>& host_of_node = {});

  /// Devices of host `host` that no pool holds.
  int free(size_t host) const;

 private:
  std::vector<Host> hosts_;
  std::vector<std::vector<std::string>> owner_;  // per host, per device: the pool holding it, or ""
};

}  // namespace hyflow::actors

namespace hyflow {
using actors::GpuAllocator;
}  // namespace hyflow
