#pragma once
// Core RL algorithms of verl's verl/trainer/ppo/core_algos.py with verl's names, argument
// order and numerics: advantage estimators, policy losses, loss aggregation, value loss,
// KL penalties and controllers. Tensors are (bs, response_length) unless stated; `index` is
// the per-row uid (grouping is by value, rows need not be contiguous).
// Differences from verl are listed in docs/algorithms.md.

#include <hyflow/algos/lr_schedule.hpp>
#include <hyflow/algos/torch_functional.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::dataproto {
class DataProto;
}
namespace hyflow {
using dataproto::DataProto;
}

namespace hyflow::algos::core_algos {

// ---------------------------------------------------------------------------------------
// Configs (verl key names and defaults)
// ---------------------------------------------------------------------------------------

/// algorithm.kl_ctrl
struct KLControlConfig {
  std::string type = "fixed";  ///< fixed | adaptive
  double kl_coef = 0.001;
  double horizon = 10000;
  double target_kl = 0.1;
};

/// The `algorithm` section (AlgoConfig).
struct AlgoConfig {
  double gamma = 1.0;
  double lam = 1.0;
  std::string adv_estimator = "gae";
  bool norm_adv_by_std_in_grpo = true;
  bool use_kl_in_reward = false;
  std::string kl_penalty = "kl";
  KLControlConfig kl_ctrl;
};

/// Normalisers that make a micro-batch loss invariant to data parallelism (verl's
/// config.global_batch_info). Unset fields fall back to the micro-batch's own counts.
struct GlobalBatchInfo {
  int64_t dp_size = 1;
  std::optional<double> batch_num_tokens;
  std::optional<double> global_batch_size;
};

/// actor.policy_loss
struct PolicyLossConfig {
  std::string loss_mode = "vanilla";
  double clip_cov_ratio = 0.0002;
  double clip_cov_lb = 1.0;
  double clip_cov_ub = 5.0;
  double kl_cov_ratio = 0.0002;
  double ppo_kl_coef = 0.1;
};

/// The parts of actor_rollout_ref.actor that policy losses read.
struct ActorConfig {
  double clip_ratio = 0.2;
  std::optional<double> clip_ratio_low = 0.2;   ///< unset: clip_ratio
  std::optional<double> clip_ratio_high = 0.2;  ///< unset: clip_ratio
  double clip_ratio_c = 3.0;                    ///< dual-clip bound, must be > 1
  std::string loss_agg_mode = "token-mean";
  std::optional<double> loss_scale_factor;      ///< seq-mean-token-sum-norm divisor
  double tau_pos = 1.0;                         ///< SAPO gate temperature for A > 0
  double tau_neg = 1.05;                        ///< SAPO gate temperature for A <= 0
  PolicyLossConfig policy_loss;
  GlobalBatchInfo global_batch_info;
};

// ---------------------------------------------------------------------------------------
// Advantage estimators: each returns {advantages, returns}
// ---------------------------------------------------------------------------------------

struct AdvantageOutput {
  at::Tensor advantages;
  at::Tensor returns;
};

/// GAE with per-token masking; advantages whitened over the mask (written everywhere),
/// returns = raw advantages + values.
AdvantageOutput compute_gae_advantage_return(const at::Tensor& token_level_rewards, const at::Tensor& values,
                                             const at::Tensor& response_mask, double gamma, double lam);

/// GRPO: (s - μ_g)/(σ_g + ε) (unbiased σ), or s - μ_g when !norm_adv_by_std_in_grpo.
/// Singleton groups use μ=0, σ=1 (float32, as verl).
AdvantageOutput compute_grpo_outcome_advantage(const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                                               const std::vector<std::string>& index, double epsilon = 1e-6,
                                               bool norm_adv_by_std_in_grpo = true);

/// GRPO through float32 scatter statistics (verl's group_mean_std): variance floored at ε
/// before the square root, ε added to σ in float32.
AdvantageOutput compute_grpo_vectorized_outcome_advantage(const at::Tensor& token_level_rewards,
                                                          const at::Tensor& response_mask,
                                                          const std::vector<std::string>& index,
                                                          double epsilon = 1e-6,
                                                          bool norm_adv_by_std_in_grpo = true);

/// Pass@k: only each group's top-1 gets r_max - r_2nd (÷ (σ+ε) if norm_adv_by_std_in_grpo).
/// Groups need ≥ 2 rows (hyflow::ValueError otherwise).
AdvantageOutput compute_grpo_passk_outcome_advantage(const at::Tensor& token_level_rewards,
                                                     const at::Tensor& response_mask,
                                                     const std::vector<std::string>& index, double epsilon = 1e-6,
                                                     bool norm_adv_by_std_in_grpo = true);

/// RLOO: n/(n-1)·(s - μ_g); singleton groups keep s.
AdvantageOutput compute_rloo_outcome_advantage(const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                                               const std::vector<std::string>& index, double epsilon = 1e-6);

/// RLOO via bincount; singleton groups get 0.
AdvantageOutput compute_rloo_vectorized_outcome_advantage(const at::Tensor& token_level_rewards,
                                                          const at::Tensor& response_mask,
                                                          const std::vector<std::string>& index,
                                                          double epsilon = 1e-6);

/// REINFORCE++: discounted return reset after each masked-out token, whitened over the mask.
AdvantageOutput compute_reinforce_plus_plus_outcome_advantage(const at::Tensor& token_level_rewards,
                                                              const at::Tensor& response_mask, double gamma);

/// REINFORCE++ with a group-mean baseline, then batch whitening.
AdvantageOutput compute_reinforce_plus_plus_baseline_outcome_advantage(const at::Tensor& token_level_rewards,
                                                                       const at::Tensor& response_mask,
                                                                       const std::vector<std::string>& index,
                                                                       double epsilon = 1e-6);

/// ReMax: returns = reverse cumsum of masked rewards; A = returns - baseline·mask.
AdvantageOutput compute_remax_outcome_advantage(const at::Tensor& token_level_rewards,
                                                const at::Tensor& reward_baselines, const at::Tensor& response_mask);

/// OPO: length-weighted group baseline.
AdvantageOutput compute_opo_outcome_advantage(const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                                              const std::vector<std::string>& index, double epsilon = 1e-6);

/// GPG: α·(s - μ_g)/f_norm with α = bs / max(#nonzero scores, 1) (the `alpha` argument is
/// overridden, as in verl).
AdvantageOutput compute_gpg_outcome_advantage(const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                                              const std::vector<std::string>& index, double epsilon = 1e-6,
                                              double f_norm = 1.0, double alpha = 1.0);

/// Optimal token baseline: per-group, per-step B_t = Σ G·W·m / (Σ W·m + ε).
AdvantageOutput compute_optimal_token_baseline_advantage(const at::Tensor& token_level_rewards,
                                                         const at::Tensor& response_mask,
                                                         const std::vector<std::string>& index,
                                                         const at::Tensor& old_log_probs,
                                                         const at::Tensor& sum_pi_squared,
                                                         const std::optional<at::Tensor>& rollout_is_weights = {},
                                                         bool handle_zero_tail = true, double epsilon = 1e-8);

/// Multi-turn (tool-interleaved) optimal token baseline: the same baseline computed on each
/// row's valid tokens compacted to the front, so the k-th response token of every trajectory
/// is aligned whatever tool tokens lie between. Rows without valid tokens get 0.
AdvantageOutput compute_multi_turn_optimal_token_baseline_advantage(
    const at::Tensor& token_level_rewards, const at::Tensor& response_mask, const std::vector<std::string>& index,
    const at::Tensor& old_log_probs, const at::Tensor& sum_pi_squared,
    const std::optional<at::Tensor>& rollout_is_weights = {}, bool handle_zero_tail = true, double epsilon = 1e-8);

/// Everything an estimator may read (verl passes these as keyword arguments).
struct AdvantageInputs {
  at::Tensor token_level_rewards;
  at::Tensor response_mask;
  std::optional<at::Tensor> values;              ///< gae
  std::optional<std::vector<std::string>> index;  ///< group estimators (uid)
  std::optional<at::Tensor> reward_baselines;    ///< remax
  std::optional<at::Tensor> old_log_probs;       ///< (tir_)optimal_token_baseline
  std::optional<at::Tensor> sum_pi_squared;      ///< optimal_token_baseline
  std::optional<at::Tensor> rollout_is_weights;  ///< optimal_token_baseline
  AlgoConfig config;                             ///< gamma, lam, norm_adv_by_std_in_grpo
};

using AdvEstimatorFn = std::function<AdvantageOutput(const AdvantageInputs&)>;

/// Registers an estimator under `name`; registering another function under a taken name
/// throws hyflow::ValueError unless `overwrite`.
void register_adv_est(const std::string& name, AdvEstimatorFn fn, bool overwrite = false);
/// The estimator registered as `name` (built-ins: gae, grpo, grpo_vectorized, grpo_passk,
/// rloo, rloo_vectorized, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, opo, gpg,
/// optimal_token_baseline, tir_optimal_token_baseline). Unknown names: hyflow::KeyError listing the known ones.
AdvEstimatorFn get_adv_estimator_fn(const std::string& name);
std::vector<std::string> registered_adv_estimators();

/// PF-PPO: resamples the batch's rows with replacement (torch::multinomial, torch's global
/// generator) with weights from s = Σ_t token_level_scores: "pow" |s|^weight_pow, "max_min"
/// 1 at the max or min score else 0, "max_random" 0.4 at the max else 0.1; each weight gets
/// + 1e-8. Tensors, non-tensor columns and meta_info lists of batch length are resampled.
/// Other methods: hyflow::ValueError.
DataProto compute_pf_ppo_reweight_data(const DataProto& data, const std::string& reweight_method = "pow",
                                       double weight_pow = 2.0);

// ---------------------------------------------------------------------------------------
// Loss aggregation, policy losses, value and entropy losses
// ---------------------------------------------------------------------------------------

/// Reduces a (bs, T) loss matrix: token-mean, seq-mean-token-sum, seq-mean-token-mean,
/// seq-mean-token-sum-norm. Unknown modes: hyflow::ValueError.
at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& loss_mask, const std::string& loss_agg_mode,
                    int64_t dp_size = 1, std::optional<double> batch_num_tokens = std::nullopt,
                    std::optional<double> global_batch_size = std::nullopt,
                    std::optional<double> loss_scale_factor = std::nullopt);

struct PolicyLossOutput {
  at::Tensor pg_loss;                         ///< scalar, differentiable w.r.t. log_prob
  std::map<std::string, double> pg_metrics;   ///< actor/pg_clipfrac, actor/ppo_kl, ...
};

using PolicyLossFn = std::function<PolicyLossOutput(
    const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
    const at::Tensor& response_mask, const std::string& loss_agg_mode, const ActorConfig& config,
    const std::optional<at::Tensor>& rollout_is_weights)>;

// All share verl's PolicyLossFn signature; rollout_is_weights multiply the token losses.
/// PPO clip with asymmetric ε_low/ε_high and dual clip (clip_ratio_c) where A < 0.
PolicyLossOutput compute_policy_loss_vanilla(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             const std::string& loss_agg_mode, const ActorConfig& config,
                                             const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);
/// GSPO sequence-level ratio; always aggregated seq-mean-token-mean.
PolicyLossOutput compute_policy_loss_gspo(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             const std::string& loss_agg_mode, const ActorConfig& config,
                                             const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);
/// SAPO sigmoid gate; always aggregated seq-mean-token-mean.
PolicyLossOutput compute_policy_loss_sapo(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             const std::string& loss_agg_mode, const ActorConfig& config,
                                             const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);
/// GPG: -log_prob·A; no metrics.
PolicyLossOutput compute_policy_loss_gpg(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             const std::string& loss_agg_mode, const ActorConfig& config,
                                             const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);
/// Clip-Cov: PPO clip, then random high-covariance tokens get no gradient (torch global RNG).
PolicyLossOutput compute_policy_loss_clip_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             const std::string& loss_agg_mode, const ActorConfig& config,
                                             const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);
/// KL-Cov: top-k covariance tokens get -A·r + ppo_kl_coef·|log r|.
PolicyLossOutput compute_policy_loss_kl_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             const std::string& loss_agg_mode, const ActorConfig& config,
                                             const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);
/// GMPO: geometric-mean sequence ratio; plain mean over sequences (loss_agg_mode unused).
PolicyLossOutput compute_policy_loss_geo_mean(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             const std::string& loss_agg_mode, const ActorConfig& config,
                                             const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);
/// CISPO: -sg(clip(r))·A·log_prob.
PolicyLossOutput compute_policy_loss_cispo(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             const std::string& loss_agg_mode, const ActorConfig& config,
                                             const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);

/// REINFORCE (verl's compute_policy_loss_reinforce, the "reinforce" loss of bypass mode):
/// L = agg(-A·log_prob·w) with w = rollout_is_weights when given; no ratio, no clipping. Metric
/// actor/ppo_kl = masked_mean(rollout_log_prob - log_prob). Not a registered loss mode, as in
/// verl. verl's default aggregation here is "seq-mean-token-sum".
PolicyLossOutput compute_policy_loss_reinforce(const at::Tensor& rollout_log_prob, const at::Tensor& log_prob,
                                               const at::Tensor& advantages, const at::Tensor& response_mask,
                                               const std::string& loss_agg_mode, const ActorConfig& config,
                                               const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);

/// The four tensors of verl's deprecated compute_policy_loss.
struct LegacyPolicyLossOutput {
  at::Tensor pg_loss;
  at::Tensor pg_clipfrac;
  at::Tensor ppo_kl;
  at::Tensor pg_clipfrac_lower;
};

/// verl's legacy (deprecated) compute_policy_loss: the vanilla PPO objective with explicit
/// clip ranges (cliprange_low/high default to cliprange; hyflow::ValueError when neither is
/// set) and agg_loss without global-batch normalisers. No IS weights.
LegacyPolicyLossOutput compute_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                           const at::Tensor& advantages, const at::Tensor& response_mask,
                                           std::optional<double> cliprange = std::nullopt,
                                           std::optional<double> cliprange_low = std::nullopt,
                                           std::optional<double> cliprange_high = std::nullopt,
                                           double clip_ratio_c = 3.0, const std::string& loss_agg_mode = "token-mean");

/// Registers a policy loss under `name` (replaces an existing one, as verl does).
void register_policy_loss(const std::string& name, PolicyLossFn fn);
/// Built-ins: vanilla, gspo, sapo, gpg, clip_cov, kl_cov, geo_mean, cispo. Unknown names:
/// hyflow::KeyError listing the known ones.
PolicyLossFn get_policy_loss_fn(const std::string& name);
std::vector<std::string> registered_policy_losses();

struct ValueLossOutput {
  at::Tensor vf_loss;
  at::Tensor vf_clipfrac;
};

/// Clipped value loss 0.5·agg(max((v-R)², (clip(v, old±c)-R)²)).
ValueLossOutput compute_value_loss(const at::Tensor& vpreds, const at::Tensor& returns, const at::Tensor& values,
                                   const at::Tensor& response_mask, double cliprange_value,
                                   const std::string& loss_agg_mode = "token-mean",
                                   const GlobalBatchInfo& global_batch_info = {},
                                   std::optional<double> loss_scale_factor = std::nullopt);

/// agg(entropy_from_logits(logits)); logits (bs, T, V).
at::Tensor compute_entropy_loss(const at::Tensor& logits, const at::Tensor& response_mask,
                                const std::string& loss_agg_mode = "token-mean");

// ---------------------------------------------------------------------------------------
// KL
// ---------------------------------------------------------------------------------------

/// KL estimate per token: kl/k1, abs, mse/k2, low_var_kl/k3; a trailing '+' (k1+, k3+,
/// low_var_kl+, ...) keeps the forward value and takes k2's gradient. "full" and unknown
/// names: hyflow::ValueError.
at::Tensor kl_penalty(const at::Tensor& logprob, const at::Tensor& ref_logprob, const std::string& kl_penalty);

/// token_level_scores - (old_log_prob - ref_log_prob)·kl_ratio
at::Tensor compute_rewards(const at::Tensor& token_level_scores, const at::Tensor& old_log_prob,
                           const at::Tensor& ref_log_prob, double kl_ratio);

/// KL coefficient holder; `value` is β.
class KLController {
 public:
  virtual ~KLController() = default;
  double value = 0.0;
  virtual void update(double current_kl, int64_t n_steps) = 0;
};

class FixedKLController final : public KLController {
 public:
  explicit FixedKLController(double kl_coef) { value = kl_coef; }
  void update(double current_kl, int64_t n_steps) override {}
};

/// β ← β·(1 + clip(kl/target - 1, ±0.2)·n_steps/horizon) (Ziegler et al. 2019).
class AdaptiveKLController final : public KLController {
 public:
  AdaptiveKLController(double init_kl_coef, double target_kl, double horizon);
  void update(double current_kl, int64_t n_steps) override;
  double target;
  double horizon;
};

/// fixed | adaptive (horizon must be > 0); other types: hyflow::ValueError.
std::unique_ptr<KLController> get_kl_controller(const KLControlConfig& kl_ctrl);

/// In-reward KL: reads response_mask, token_level_scores, old_log_probs, ref_log_prob from
/// data.batch, writes token_level_rewards = scores - β·kld·mask, updates the controller with
/// n_steps = batch size and returns actor/reward_kl_penalty{,_coeff} (β read before update).
std::map<std::string, double> apply_kl_penalty(DataProto& data, KLController& kl_ctrl,
                                               const std::string& kl_penalty = "kl");

}  // namespace hyflow::algos::core_algos
