#pragma once
// Placement: a trainer's workers, from its role table (worker_roles.hpp). It owns the Runtime
// (in-process, or connected to the caf-node processes of cluster.nodes with the secret, TLS
// and data plane of the cluster section), builds one resource pool per pool name of the table,
// places the roles of the "global" pool colocated in one worker (verl's WorkerDict) and gives
// each role its own WorkerGroup view (verl's spawn); a role alone on another pool gets workers of
// its own. Every enabled role's config is checked (RoleSpec::check) before anything is launched.

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
  /// pool name in `roles` is a ValueError naming the role.
  Placement(const std::vector<RoleSpec>& roles, const std::vector<PoolSpec>& pools, const TrainerSection& trainer,
            const ClusterSection& cluster);
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
