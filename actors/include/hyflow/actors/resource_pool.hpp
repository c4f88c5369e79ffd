#pragma once
// Resource pools (verl's ResourcePool / ResourcePoolManager): how many worker processes a
// group gets on each node, and which role runs on which pool. In-process runs place every
// worker in the controller's process; the cluster layer maps nodes to machines.

#include <hyflow/actors/worker.hpp>

#include <map>
#include <string>
#include <vector>

namespace hyflow::actors {

class ResourcePool {
 public:
  /// process_on_nodes[i]: workers on node i (e.g. {8, 8}). max_colocate_count: how many
  /// groups may share one device (verl: a fractional GPU per group).
  explicit ResourcePool(std::vector<int> process_on_nodes, int max_colocate_count = 10, int n_gpus_per_node = 8,
                        bool use_gpu = false);

  int world_size() const;
  const std::vector<int>& store() const { return process_on_nodes_; }
  /// Workers per node, one entry per rank (verl's local_world_size_list).
  std::vector<int> local_world_size_list() const;
  /// Local rank of every rank.
  std::vector<int> local_rank_list() const;
  void add_node(int process_count);
  int max_colocate_count() const { return max_colocate_count_; }
  int n_gpus_per_node() const { return n_gpus_per_node_; }
  bool use_gpu() const { return use_gpu_; }

  /// Whether the workers of `workers_per_node` get GPUs under a device setting (verl's
  /// trainer.device): "cpu" never; "cuda" always, a ValueError naming `key`, the node and both
  /// counts when node i offers fewer than its workers (`gpus_per_node`[i]: the CUDA devices it
  /// advertises or this process sees); "auto" when every node offers one per worker, else the
  /// CPU. Other values are a ValueError naming `key`.
  static bool wants_gpus(const std::string& device, const std::vector<int>& workers_per_node,
                         const std::vector<int>& gpus_per_node, const std::string& key = "trainer.device");

  /// The CUDA device of every worker, per node (devices[node][local_rank]), drawn for this pool
  /// from the node's GPUs by a GpuAllocator so that pools sharing a node do not share devices.
  /// Needs use_gpu and one device per worker of each node (ValueError naming the node otherwise).
  void set_devices(std::vector<std::vector<int>> devices);
  /// The devices set by set_devices (empty: none set, workers get cuda:{local_rank}).
  const std::vector<std::vector<int>>& devices() const { return devices_; }

  /// Deterministic placement: rank order is node order, then local rank. Names are
  /// "{prefix}{type}_{node}:{local_rank}"; devices "cuda:{devices()[node][local_rank]}" (or
  /// "cuda:{local_rank}" when none were set) with use_gpu, else "cpu": a logical index into the
  /// node's CUDA_VISIBLE_DEVICES.
  std::vector<WorkerEnv> place(const std::string& name_prefix, const std::string& type, const std::string& master_addr,
                               int master_port) const;

 private:
  std::vector<int> process_on_nodes_;
  int max_colocate_count_;
  int n_gpus_per_node_;
  bool use_gpu_;
  std::vector<std::vector<int>> devices_;
};

/// Pools by name and roles by pool (verl's ResourcePoolManager).
class ResourcePoolManager {
 public:
  /// spec: pool name -> processes per node; mapping: role -> pool name.
  ResourcePoolManager(std::map<std::string, std::vector<int>> spec, std::map<std::string, std::string> mapping,
                      int max_colocate_count = 3, int n_gpus_per_node = 8, bool use_gpu = false);

  /// Builds the pools (after check_resources passes).
  void create_resource_pools();
  /// The pool of `role`; KeyError naming the role (or the pool when not created yet).
  ResourcePool& get_resource_pool(const std::string& role);
  /// Devices all pools need together.
  int get_n_gpus() const;
  /// ValueError when `available_per_node` cannot hold every pool: names the pool, what it
  /// needs and what is there.
  void check_resources(const std::vector<int>& available_per_node) const;

 private:
  std::map<std::string, std::vector<int>> spec_;
  std::map<std::string, std::string> mapping_;
  int max_colocate_count_;
  int n_gpus_per_node_;
  bool use_gpu_;
  std::map<std::string, ResourcePool> pools_;
};

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
using actors::ResourcePool;
using actors::ResourcePoolManager;
}  // namespace hyflow
