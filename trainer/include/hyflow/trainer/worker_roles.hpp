#pragma once
// The role table of a trainer: which worker type hosts each RL role, with which config, on which
// resource pool (verl's role_worker_mapping + resource_pool_spec). The PPO trainer's table is
// ppo_roles(); a trainer loop of your own (DPO, distillation) writes its own table and hands it
// to Placement (placement.hpp). docs/trainer.md, "Writing a trainer loop".

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hyflow::trainer {

struct PPOConfig;

/// One RL role and the worker that hosts it.
struct RoleSpec {
  /// The role's name: its method prefix in the colocated worker ("actor_rollout_ref", "critic").
  std::string name;
  /// A registered worker type ("ActorRolloutRefWorker").
  std::string worker_type;
  /// The worker's init args (for the built-in workers {"config": <subtree>, ...}).
  nlohmann::json init_args;
  /// Off: the role is not placed (the critic without GAE, the reward model without reward_model.enable).
  bool enabled = true;
  /// The resource pool: roles of one pool share its workers (colocated, verl's WorkerDict);
  /// a role alone on another pool gets workers of its own.
  std::string pool = "global";
  /// Checks init_args on the controller the way the worker will (ValueError / KeyError naming
  /// the key), so a bad value fails before anything is launched; empty: no check.
  std::function<void(const nlohmann::json& init_args)> check;
};

/// Workers per node of one resource pool (verl's resource_pool_spec entry).
struct PoolSpec {
  std::string name;
  std::vector<int> workers_per_node;
  /// Prefix of its workers' names ("rollout_"): tells groups apart in messages.
  std::string name_prefix;
};

/// The PPO-family trainer's pools: "global" (trainer.nnodes x trainer.n_gpus_per_node) and
/// "rollout" (actor_rollout_ref.rollout.nnodes x n_gpus_per_node, for separate_async).
std::vector<PoolSpec> ppo_pools(const PPOConfig& config);

/// The PPO-family trainer's roles: actor_rollout_ref (always), critic (use_critic), rm
/// (reward_model.enable) on the global pool and, with trainer.v1 separate_async, rollout on a
/// pool of its own. Their subtrees are resolved as verl's trainer resolves them: prompt and
/// response lengths from data.*, rollout.seed from trainer.seed, the critic's batch settings from
/// the actor's, `total_steps` as both optimizers' schedule length.
std::vector<RoleSpec> ppo_roles(const PPOConfig& config, int64_t total_steps);

/// Runs role.check on role.init_args (when both are set), naming the role on failure.
void check_role_config(const RoleSpec& role);

}  // namespace hyflow::trainer
