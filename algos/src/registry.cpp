// Name -> function registries for advantage estimators and policy losses (verl's
// register_adv_est / register_policy_loss), pre-filled with the built-ins.
#include <hyflow/core/error.hpp>
#include <hyflow/core/named_registry.hpp>
#include <hyflow/algos/core_algos.hpp>

#include <map>
#include <string>

namespace hyflow::algos::core_algos {
namespace {

const std::vector<std::string>& require_index(const AdvantageInputs& in, const char* name) {
  if (!in.index) throw KeyError(std::string("advantage estimator '") + name + "' needs `index` (the uid column)");
  return *in.index;
}

const at::Tensor& require(const std::optional<at::Tensor>& t, const char* name, const char* what) {
  if (!t) throw KeyError(std::string("advantage estimator '") + name + "' needs `" + what + "`");
  return *t;
}

std::map<std::string, AdvEstimatorFn> builtin_estimators() {
  std::map<std::string, AdvEstimatorFn> t;
  t["gae"] = [](const AdvantageInputs& in) {
    return compute_gae_advantage_return(in.token_level_rewards, require(in.values, "gae", "values"),
                                        in.response_mask, in.config.gamma, in.config.lam);
  };
  t["grpo"] = [](const AdvantageInputs& in) {
    return compute_grpo_outcome_advantage(in.token_level_rewards, in.response_mask, require_index(in, "grpo"), 1e-6,
                                          in.config.norm_adv_by_std_in_grpo);
  };
  t["grpo_vectorized"] = [](const AdvantageInputs& in) {
    return compute_grpo_vectorized_outcome_advantage(in.token_level_rewards, in.response_mask,
                                                     require_index(in, "grpo_vectorized"), 1e-6,
                                                     in.config.norm_adv_by_std_in_grpo);
  };
  t["grpo_passk"] = [](const AdvantageInputs& in) {
    return compute_grpo_passk_outcome_advantage(in.token_level_rewards, in.response_mask,
                                                require_index(in, "grpo_passk"), 1e-6,
                                                in.config.norm_adv_by_std_in_grpo);
  };
  t["rloo"] = [](const AdvantageInputs& in) {
    return compute_rloo_outcome_advantage(in.token_level_rewards, in.response_mask, require_index(in, "rloo"));
  };
  t["rloo_vectorized"] = [](const AdvantageInputs& in) {
    return compute_rloo_vectorized_outcome_advantage(in.token_level_rewards, in.response_mask,
                                                     require_index(in, "rloo_vectorized"));
  };
  t["reinforce_plus_plus"] = [](const AdvantageInputs& in) {
    return compute_reinforce_plus_plus_outcome_advantage(in.token_level_rewards, in.response_mask, in.config.gamma);
  };
  t["reinforce_plus_plus_baseline"] = [](const AdvantageInputs& in) {
    return compute_reinforce_plus_plus_baseline_outcome_advantage(in.token_level_rewards, in.response_mask,
                                                                  require_index(in, "reinforce_plus_plus_baseline"));
  };
  t["remax"] = [](const AdvantageInputs& in) {
    return compute_remax_outcome_advantage(in.token_level_rewards,
                                           require(in.reward_baselines, "remax", "reward_baselines"),
                                           in.response_mask);
  };
  t["opo"] = [](const AdvantageInputs& in) {
    return compute_opo_outcome_advantage(in.token_level_rewards, in.response_mask, require_index(in, "opo"));
  };
  t["gpg"] = [](const AdvantageInputs& in) {
    return compute_gpg_outcome_advantage(in.token_level_rewards, in.response_mask, require_index(in, "gpg"));
  };
  t["optimal_token_baseline"] = [](const AdvantageInputs& in) {
    constexpr const char* name = "optimal_token_baseline";
    return compute_optimal_token_baseline_advantage(
        in.token_level_rewards, in.response_mask, require_index(in, name),
        require(in.old_log_probs, name, "old_log_probs"), require(in.sum_pi_squared, name, "sum_pi_squared"),
        in.rollout_is_weights);
  };
  t["tir_optimal_token_baseline"] = [](const AdvantageInputs& in) {
    constexpr const char* name = "tir_optimal_token_baseline";
    return compute_multi_turn_optimal_token_baseline_advantage(
        in.token_level_rewards, in.response_mask, require_index(in, name),
        require(in.old_log_probs, name, "old_log_probs"), require(in.sum_pi_squared, name, "sum_pi_squared"),
        in.rollout_is_weights);
  };
  return t;
}

std::map<std::string, PolicyLossFn> builtin_policy_losses() {
  std::map<std::string, PolicyLossFn> t;
  t["vanilla"] = compute_policy_loss_vanilla;
  t["gspo"] = compute_policy_loss_gspo;
  t["sapo"] = compute_policy_loss_sapo;
  t["gpg"] = compute_policy_loss_gpg;
  t["clip_cov"] = compute_policy_loss_clip_cov;
  t["kl_cov"] = compute_policy_loss_kl_cov;
  t["geo_mean"] = compute_policy_loss_geo_mean;
  t["cispo"] = compute_policy_loss_cispo;
  return t;
}

NamedRegistry<AdvEstimatorFn>& estimators() {
  static NamedRegistry<AdvEstimatorFn> registry("advantage estimator", builtin_estimators());
  return registry;
}

NamedRegistry<PolicyLossFn>& policy_losses() {
  static NamedRegistry<PolicyLossFn> registry("policy loss mode", builtin_policy_losses());
  return registry;
}

}  // namespace

void register_adv_est(const std::string& name, AdvEstimatorFn fn, bool overwrite) {
  estimators().put(name, std::move(fn), overwrite);
}

AdvEstimatorFn get_adv_estimator_fn(const std::string& name) {
  return estimators().get(name);
}

std::vector<std::string> registered_adv_estimators() {
  return estimators().names();
}

void register_policy_loss(const std::string& name, PolicyLossFn fn) {
  policy_losses().put(name, std::move(fn), /*overwrite=*/true);  // verl's register_policy_loss replaces
}

PolicyLossFn get_policy_loss_fn(const std::string& name) {
  return policy_losses().get(name);
}

std::vector<std::string> registered_policy_losses() {
  return policy_losses().names();
}

}  // namespace hyflow::algos::core_algos
