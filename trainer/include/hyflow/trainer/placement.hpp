#pragma once
// Placement: a trainer's workers, from its role table (worker_roles.hpp). It owns the Runtime
// (in-process, or connected to the caf-node processes of cluster.nodes with the secret, TLS
// and data plane of the cluster section), builds one resource pool per pool name of the table,
// places the roles of the "global" pool colocated in one worker (verl's WorkerDict) and gives
// each role its own WorkerGroup view (verl's spawn); a role alone on another pool gets workers of
// its own. With GPUs (trainer.device) the pools draw disjoint devices from one GpuAllocator of the
// hosts' GPUs (this process in-process, each caf-node on a cluster): the training pool and a
// separate rollout pool never share a GPU; the roles of one pool share its devices. Every enabled
// role's config is checked (RoleSpec::check) before anything is launched.

#include <hyflow/actors/all.hpp>
#include <hyflow/trainer/ppo_config.hpp>
#include <hyflow/trainer/worker_roles.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::trainer {

class Placement {
 public:
  /// Launches the workers of every enabled role (no model is loaded: init_model is a call).
  /// `trainer` gives device and call_timeout_s; `cluster` where the workers run. An unknown
  /// pool name in `roles` is a ValueError naming the role. `gpus_in_process`: the CUDA devices
  /// an in-process run places workers on (default: the ones this process sees); tests inject a
  /// count to check placement without a GPU.
  Placement(const std::vector<RoleSpec>& roles, const std::vector<PoolSpec>& pools, const TrainerSection& trainer,
            const ClusterSection& cluster, std::optional<int> gpus_in_process = std::nullopt);
  ~Placement();
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;

  bool has(const std::string& role) const { return groups_.count(role) > 0; }
  /// The group of an enabled role; KeyError naming it otherwise.
  WorkerGroup& group(const std::string& role);
  /// The group of a role, or null when it is not placed.
  WorkerGroup* find(const std::string& role);
  Runtime& runtime() { return *runtime_; }

 private:
  std::unique_ptr<Runtime> runtime_;   // first: destroyed after the groups (it owns the launcher)
  std::optional<WorkerGroup> bundle_;  // the colocated workers of the global pool
  std::map<std::string, WorkerGroup> groups_;
};

}  // namespace hyflow::trainer
