// The PPO trainer's role table: verl's subtrees with its nulls resolved, and the workers'
// own parsers as the controller-side checks.
#include <hyflow/trainer/worker_roles.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/trainer/ppo_config.hpp>
#include <hyflow/workers/config.hpp>

namespace hyflow::trainer {

using Json = nlohmann::json;

std::vector<RoleSpec> ppo_roles(const PPOConfig& c, int64_t total_steps) {
  Json arr = c.actor_rollout_ref;
  auto& rollout = arr["rollout"];
  if (!rollout.contains("prompt_length")) rollout["prompt_length"] = c.data.max_prompt_length;
  if (!rollout.contains("response_length")) rollout["response_length"] = c.data.max_response_length;
  rollout["seed"] = c.trainer.seed;
  rollout["apply_chat_template_kwargs"] = {{"list_tools", c.data.list_tools}};
  if (c.data.default_system) rollout["apply_chat_template_kwargs"]["default_system"] = *c.data.default_system;
  // the "server" backend serves the policy's own tokenizer (verl's tokenizer_path defaults likewise)
  if (rollout.value("name", "") == "server" &&
      (!rollout.contains("server") || !rollout["server"].contains("tokenizer_path") ||
       rollout["server"]["tokenizer_path"].is_null()))
    rollout["server"]["tokenizer_path"] = arr["model"].value("path", "");
  arr["actor"]["optim"]["total_training_steps"] = total_steps;
  auto check_arr = [](const Json& args) {
    (void)workers::parse_actor_rollout_ref_config(args.at("config"));
    (void)workers::parse_role(args.at("role").get<std::string>());
  };
  std::vector<RoleSpec> roles;
  roles.push_back({.name = "actor_rollout_ref",
                   .worker_type = "ActorRolloutRefWorker",
                   .init_args = {{"config", arr}, {"role", "actor_rollout_ref"}},
                   .check = check_arr});

  Json cr = c.critic;
  cr.erase("enable");
  if (cr["model"].value("path", "").empty()) cr["model"]["path"] = arr["model"].value("path", "");
  for (const char* key : {"ppo_mini_batch_size", "ppo_epochs", "ppo_micro_batch_size_per_gpu"})
    if (!cr.contains(key) && arr["actor"].contains(key)) cr[key] = arr["actor"][key];
  if (!cr.contains("loss_agg_mode")) cr["loss_agg_mode"] = arr["actor"].value("loss_agg_mode", "token-mean");
  cr["rollout_n"] = c.rollout_n();
  cr["optim"]["total_training_steps"] = total_steps;
  roles.push_back({.name = "critic",
                   .worker_type = "CriticWorker",
                   .init_args = {{"config", cr}},
                   .enabled = c.use_critic(),
                   .check = [](const Json& args) { (void)workers::parse_critic_config(args.at("config")); }});

  Json rmc = c.reward_model;  // the worker's keys of the section (the reward manager keys are the trainer's)
  for (const char* trainer_key : {"enable", "reward_manager", "overlong_buffer"}) rmc.erase(trainer_key);
  // One process group per worker, shared by its roles, so one NCCL timeout: the actor's. The
  // reward model has no key of its own (verl's neither); the critic's must be equal.
  const auto arr_config = workers::parse_actor_rollout_ref_config(arr);
  rmc["nccl_timeout"] = arr_config.nccl_timeout;
  if (c.use_critic()) {
    const auto critic_timeout = workers::parse_critic_config(cr).nccl_timeout;
    if (critic_timeout != arr_config.nccl_timeout)
      throw ValueError("config key 'critic.nccl_timeout' is " + std::to_string(critic_timeout) +
                       " s and 'actor_rollout_ref.nccl_timeout' " + std::to_string(arr_config.nccl_timeout) +
                       " s: the critic shares the actor's workers and their process group (one NCCL timeout); set "
                       "them equal");
  }
  roles.push_back({.name = "rm",
                   .worker_type = "RewardModelWorker",
                   .init_args = {{"config", rmc}},
                   .enabled = c.use_rm(),
                   .check = [](const Json& args) { (void)workers::parse_reward_model_config(args.at("config")); }});

  // separate_async: the rollout-only workers (verl's standalone rollout replicas)
  roles.push_back({.name = "rollout",
                   .worker_type = "ActorRolloutRefWorker",
                   .init_args = {{"config", arr}, {"role", "rollout"}},
                   .enabled = c.async.separate(),
                   .pool = "rollout",
                   .check = check_arr});
  return roles;
}

std::vector<PoolSpec> ppo_pools(const PPOConfig& c) {
  auto per_node = [](int64_t nodes, int64_t workers) {
    return std::vector<int>(static_cast<size_t>(nodes), static_cast<int>(workers));
  };
  return {{.name = "global", .workers_per_node = per_node(c.trainer.nnodes, c.trainer.n_gpus_per_node)},
          {.name = "rollout",
           .workers_per_node = per_node(c.async.rollout_nnodes, c.async.rollout_n_gpus_per_node),
           .name_prefix = "rollout_"}};
}

void check_role_config(const RoleSpec& role) {
  if (role.check && !role.init_args.is_null()) role.check(role.init_args);
}

}  // namespace hyflow::trainer
