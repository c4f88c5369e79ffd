// Policy losses of verl core_algos.py, signature (old_log_prob, log_prob, advantages,
// response_mask, loss_agg_mode, config, rollout_is_weights) -> {pg_loss, pg_metrics}.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <string>

namespace hyflow::algos::core_algos {
namespace {

using OptTensor = std::optional<at::Tensor>;

void check_inputs(const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
                  const at::Tensor& response_mask, const OptTensor& rollout_is_weights, const char* fn) {
  auto shape = response_mask.sizes();
  auto check = [&](const at::Tensor& t, const char* name) {
    if (t.sizes() != shape) {
      throw ShapeError(std::string(fn) + ": " + name + " " + c10::str(t.sizes()) + " must match response_mask " +
                       c10::str(shape));
    }
  };
  check(old_log_prob, "old_log_prob");
  check(log_prob, "log_prob");
  check(advantages, "advantages");
  if (rollout_is_weights) check(*rollout_is_weights, "rollout_is_weights");
}

double clip_low(const ActorConfig& c) { return c.clip_ratio_low.value_or(c.clip_ratio); }
double clip_high(const ActorConfig& c) { return c.clip_ratio_high.value_or(c.clip_ratio); }

at::Tensor aggregate(const at::Tensor& pg_losses, const at::Tensor& mask, const std::string& mode,
                     const ActorConfig& config) {
  const auto& info = config.global_batch_info;
  return agg_loss(pg_losses, mask, mode, info.dp_size, info.batch_num_tokens, info.global_batch_size,
                  config.loss_scale_factor);
}

at::Tensor apply_is_weights(const at::Tensor& pg_losses, const OptTensor& rollout_is_weights) {
  return rollout_is_weights ? pg_losses * *rollout_is_weights : pg_losses;
}

double item(const at::Tensor& t) { return t.detach().item<double>(); }

at::Tensor as_float(const at::Tensor& b) { return b.to(torch::kFloat); }

}  // namespace

namespace {

// The clipped PPO objective shared by compute_policy_loss_vanilla and the legacy
// compute_policy_loss: token losses before weighting/aggregation, and the three statistics.
struct ClippedObjective {
  at::Tensor pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower;
};

ClippedObjective clipped_objective(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                   const at::Tensor& advantages, const at::Tensor& response_mask, double cliprange_low,
                                   double cliprange_high, double clip_ratio_c, const char* fn) {
  if (!(clip_ratio_c > 1.0)) {
    throw ValueError(std::string(fn) + ": clip_ratio_c (dual-clip lower bound) must be > 1.0, got " +
                     std::to_string(clip_ratio_c));
  }
  auto negative_approx_kl = torch::clamp(log_prob - old_log_prob, -20.0, 20.0);
  auto ratio = torch::exp(negative_approx_kl);
  auto ppo_kl = masked_mean(-negative_approx_kl, response_mask);

  auto pg_losses1 = -advantages * ratio;
  auto pg_losses2 = -advantages * torch::clamp(ratio, 1 - cliprange_low, 1 + cliprange_high);
  auto clip_pg_losses1 = torch::maximum(pg_losses1, pg_losses2);
  auto pg_clipfrac = masked_mean(as_float(torch::gt(pg_losses2, pg_losses1)), response_mask);

  // Dual clip bounds the loss by -A·c, only where the advantage is negative.
  auto pg_losses3 = -advantages * clip_ratio_c;
  auto clip_pg_losses2 = torch::min(pg_losses3, clip_pg_losses1);
  auto pg_clipfrac_lower =
      masked_mean(as_float(torch::logical_and(torch::gt(clip_pg_losses1, pg_losses3), advantages < 0)), response_mask);
  auto pg_losses = torch::where(advantages < 0, clip_pg_losses2, clip_pg_losses1);
  return {pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower};
}

}  // namespace

PolicyLossOutput compute_policy_loss_vanilla(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             const std::string& loss_agg_mode, const ActorConfig& config,
                                             const OptTensor& rollout_is_weights) {
  check_inputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights, "compute_policy_loss_vanilla");
  auto o = clipped_objective(old_log_prob, log_prob, advantages, response_mask, clip_low(config), clip_high(config),
                             config.clip_ratio_c, "compute_policy_loss_vanilla");
  auto pg_loss = aggregate(apply_is_weights(o.pg_losses, rollout_is_weights), response_mask, loss_agg_mode, config);
  return {pg_loss,
          {{"actor/pg_clipfrac", item(o.pg_clipfrac)},
           {"actor/ppo_kl", item(o.ppo_kl)},
           {"actor/pg_clipfrac_lower", item(o.pg_clipfrac_lower)}}};
}

LegacyPolicyLossOutput compute_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                           const at::Tensor& advantages, const at::Tensor& response_mask,
                                           std::optional<double> cliprange, std::optional<double> cliprange_low,
                                           std::optional<double> cliprange_high, double clip_ratio_c,
                                           const std::string& loss_agg_mode) {
  check_inputs(old_log_prob, log_prob, advantages, response_mask, std::nullopt, "compute_policy_loss");
  if (!cliprange_low) cliprange_low = cliprange;
  if (!cliprange_high) cliprange_high = cliprange;
  if (!cliprange_low || !cliprange_high) {
    throw ValueError("compute_policy_loss: set cliprange, or both cliprange_low and cliprange_high");
  }
  auto o = clipped_objective(old_log_prob, log_prob, advantages, response_mask, *cliprange_low, *cliprange_high,
                             clip_ratio_c, "compute_policy_loss");
  return {agg_loss(o.pg_losses, response_mask, loss_agg_mode), o.pg_clipfrac, o.ppo_kl, o.pg_clipfrac_lower};
}

PolicyLossOutput compute_policy_loss_reinforce(const at::Tensor& rollout_log_prob, const at::Tensor& log_prob,
                                               const at::Tensor& advantages, const at::Tensor& response_mask,
                                               const std::string& loss_agg_mode, const ActorConfig& config,
                                               const OptTensor& rollout_is_weights) {
  check_inputs(rollout_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
               "compute_policy_loss_reinforce");
  // Plain policy gradient: no ratio, no clipping; IS weights (constants) scale the tokens.
  auto pg_losses = apply_is_weights(-advantages * log_prob, rollout_is_weights);
  auto pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config);
  auto kl_divergence = masked_mean(-(log_prob - rollout_log_prob), response_mask);
  return {pg_loss, {{"actor/ppo_kl", item(kl_divergence)}}};
}

PolicyLossOutput compute_policy_loss_gspo(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                          const at::Tensor& advantages, const at::Tensor& response_mask,
                                          const std::string& /*loss_agg_mode*/, const ActorConfig& config,
                                          const OptTensor& rollout_is_weights) {
  check_inputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights, "compute_policy_loss_gspo");
  auto negative_approx_kl = log_prob - old_log_prob;
  // s_i = exp(mean_t log r): one importance ratio per sequence.
  auto seq_lengths = response_mask.sum(-1).clamp_min(1);
  auto negative_approx_kl_seq = (negative_approx_kl * response_mask).sum(-1) / seq_lengths;
  // Token ratio = sg(s_i)·π/sg(π): the value of s_i with the gradient of log π.
  auto log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1);
  log_seq_importance_ratio = torch::clamp_max(log_seq_importance_ratio, 10.0);
  auto seq_importance_ratio = torch::exp(log_seq_importance_ratio);

  auto pg_losses1 = -advantages * seq_importance_ratio;
  auto pg_losses2 = -advantages * torch::clamp(seq_importance_ratio, 1 - clip_low(config), 1 + clip_high(config));
  auto pg_losses = apply_is_weights(torch::maximum(pg_losses1, pg_losses2), rollout_is_weights);
  // GSPO is defined on sequence means: loss_agg_mode is ignored, as in verl.
  auto pg_loss = aggregate(pg_losses, response_mask, "seq-mean-token-mean", config);
  auto pg_clipfrac = masked_mean(as_float(torch::gt(pg_losses2, pg_losses1)), response_mask);
  auto ppo_kl = masked_mean(-negative_approx_kl, response_mask);
  return {pg_loss,
          {{"actor/pg_clipfrac", item(pg_clipfrac)}, {"actor/ppo_kl", item(ppo_kl)}, {"actor/pg_clipfrac_lower", 0.0}}};
}

PolicyLossOutput compute_policy_loss_sapo(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                          const at::Tensor& advantages, const at::Tensor& response_mask,
                                          const std::string& /*loss_agg_mode*/, const ActorConfig& config,
                                          const OptTensor& rollout_is_weights) {
  check_inputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights, "compute_policy_loss_sapo");
  auto opts = advantages.options();
  auto tau_pos = torch::scalar_tensor(config.tau_pos, opts);
  auto tau_neg = torch::scalar_tensor(config.tau_neg, opts);
  auto negative_approx_kl = torch::clamp(log_prob - old_log_prob, -20.0, 20.0);
  auto ratio = torch::exp(negative_approx_kl);
  auto taus = torch::where(advantages > 0, tau_pos, tau_neg);
  // Soft gate σ(τ(r-1))·4/τ replaces the hard clip; its slope at r = 1 is 1.
  auto gates = torch::sigmoid(taus * (ratio - 1.0)) * (4.0 / taus);
  auto pg_losses = apply_is_weights(-gates * advantages, rollout_is_weights);
  auto pg_loss = aggregate(pg_losses, response_mask, "seq-mean-token-mean", config);
  auto ppo_kl = masked_mean(-negative_approx_kl, response_mask);
  return {pg_loss, {{"actor/pg_clipfrac", 0.0}, {"actor/ppo_kl", item(ppo_kl)}, {"actor/pg_clipfrac_lower", 0.0}}};
}

PolicyLossOutput compute_policy_loss_gpg(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                         const at::Tensor& advantages, const at::Tensor& response_mask,
                                         const std::string& loss_agg_mode, const ActorConfig& config,
                                         const OptTensor& rollout_is_weights) {
  check_inputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights, "compute_policy_loss_gpg");
  auto pg_losses = apply_is_weights(-log_prob * advantages, rollout_is_weights);
  return {aggregate(pg_losses, response_mask, loss_agg_mode, config), {}};
}

PolicyLossOutput compute_policy_loss_clip_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                              const at::Tensor& advantages, const at::Tensor& response_mask,
                                              const std::string& loss_agg_mode, const ActorConfig& config,
                                              const OptTensor& rollout_is_weights) {
  check_inputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
               "compute_policy_loss_clip_cov");
  const auto& pl = config.policy_loss;
  if (!(pl.clip_cov_ratio > 0)) {
    throw ValueError("compute_policy_loss_clip_cov: policy_loss.clip_cov_ratio must be > 0, got " +
                     std::to_string(pl.clip_cov_ratio));
  }
  auto negative_approx_kl = log_prob - old_log_prob;
  auto ratio = torch::exp(negative_approx_kl);
  auto ppo_kl = masked_mean(-negative_approx_kl, response_mask);
  auto pg_losses1 = -advantages * ratio;
  auto pg_losses2 = -advantages * torch::clamp(ratio, 1 - clip_low(config), 1 + clip_high(config));

  auto corr = torch::ones_like(advantages);
  {
    torch::NoGradGuard no_grad;
    auto valid = response_mask > 0;
    auto clip_by_origin = torch::logical_and(pg_losses2 > pg_losses1, valid);
    auto cov_all = (advantages - masked_mean(advantages, response_mask)) *
                   (log_prob.detach() - masked_mean(log_prob.detach(), response_mask));
    const double neg_inf = -std::numeric_limits<double>::infinity();
    cov_all = cov_all.masked_fill(response_mask == 0, neg_inf).masked_fill(clip_by_origin, neg_inf);
    const auto clip_num = std::max<int64_t>(
        static_cast<int64_t>(pl.clip_cov_ratio * response_mask.sum().item<double>()), 1);
    auto candidates = torch::nonzero(
        torch::logical_and(torch::logical_and(cov_all < pl.clip_cov_ub, cov_all > pl.clip_cov_lb), valid));
    const int64_t n = candidates.size(0);
    if (n > 0) {
      // Detach a random subset of the high-covariance tokens (torch's global generator).
      auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong));
      auto chosen = candidates.index_select(0, perm.slice(0, 0, std::min(clip_num, n)).to(candidates.device()));
      corr.index_put_({chosen.select(1, 0), chosen.select(1, 1)}, 0);
    }
  }
  auto pg_clipfrac = masked_mean(as_float(corr == 0), response_mask);
  auto pg_losses = apply_is_weights(torch::maximum(pg_losses1, pg_losses2) * corr, rollout_is_weights);
  auto pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config);
  return {pg_loss, {{"actor/pg_clipfrac", item(pg_clipfrac)}, {"actor/ppo_kl", item(ppo_kl)}}};
}

PolicyLossOutput compute_policy_loss_kl_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                            const at::Tensor& advantages, const at::Tensor& response_mask,
                                            const std::string& loss_agg_mode, const ActorConfig& config,
                                            const OptTensor& rollout_is_weights) {
  check_inputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
               "compute_policy_loss_kl_cov");
  const auto& pl = config.policy_loss;
  if (!(pl.kl_cov_ratio > 0)) {
    throw ValueError("compute_policy_loss_kl_cov: policy_loss.kl_cov_ratio must be > 0, got " +
                     std::to_string(pl.kl_cov_ratio));
  }
  auto negative_approx_kl = log_prob - old_log_prob;
  auto abs_kl = negative_approx_kl.abs();
  auto ratio = torch::exp(negative_approx_kl);
  auto ppo_kl_abs = masked_mean(abs_kl, response_mask);
  auto pg_losses1 = -advantages * ratio;
  auto pg_losses_kl = -advantages * ratio + pl.ppo_kl_coef * abs_kl;

  auto selected = torch::zeros({advantages.numel()}, torch::TensorOptions().dtype(torch::kBool));
  {
    torch::NoGradGuard no_grad;
    auto valid = (response_mask > 0).reshape(-1).cpu();
    auto valid_idx = torch::nonzero(valid).reshape(-1);
    const int64_t n = valid_idx.size(0);
    if (n > 0) {
      auto adv = advantages.detach().reshape(-1).cpu().index_select(0, valid_idx);
      auto logp = log_prob.detach().reshape(-1).cpu().index_select(0, valid_idx);
      auto cov = (adv - adv.mean()) * (logp - logp.mean());
      const auto k = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * pl.kl_cov_ratio));
      auto top = std::get<1>(torch::topk(cov, k, -1, /*largest=*/true));
      selected.index_fill_(0, valid_idx.index_select(0, top), true);
    }
  }
  auto use_kl = selected.reshape(advantages.sizes()).to(advantages.device());
  auto pg_losses = apply_is_weights(torch::where(use_kl, pg_losses_kl, pg_losses1), rollout_is_weights);
  auto pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config);
  return {pg_loss, {{"actor/ppo_kl", item(ppo_kl_abs)}}};
}

PolicyLossOutput compute_policy_loss_geo_mean(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                              const at::Tensor& advantages, const at::Tensor& response_mask,
                                              const std::string& /*loss_agg_mode*/, const ActorConfig& config,
                                              const OptTensor& rollout_is_weights) {
  check_inputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
               "compute_policy_loss_geo_mean");
  auto negative_approx_kl = log_prob - old_log_prob;
  auto ppo_kl = masked_mean(-negative_approx_kl, response_mask);
  // Token-level clip in log space, on the side the advantage's sign makes harmful.
  auto sgn_advantage = torch::sign(advantages);
  auto negative_approx_kl_clamp = torch::clamp(negative_approx_kl, -clip_low(config), clip_high(config));
  auto negative_approx_kl_min =
      sgn_advantage * torch::min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp);
  auto response_mask_sum = response_mask.sum(-1);
  auto ratio = torch::exp((negative_approx_kl_min * response_mask).sum(-1) / (response_mask_sum + 1e-8));
  auto advantage = (advantages * response_mask).sum(-1) / (response_mask_sum + 1e-8);
  auto pg_losses = -advantage * ratio;
  if (rollout_is_weights) {
    // Sequence weight = geometric mean of the token weights.
    auto seq_is_weights =
        torch::exp((torch::log(*rollout_is_weights + 1e-10) * response_mask).sum(-1) / (response_mask_sum + 1e-8));
    pg_losses = pg_losses * seq_is_weights;
  }
  auto pg_loss = pg_losses.mean();
  auto clipped = torch::ne(negative_approx_kl, negative_approx_kl_clamp);
  auto pg_clipfrac = masked_mean(as_float(torch::logical_and(clipped, advantages > 0)), response_mask);
  auto pg_clipfrac_lower = masked_mean(as_float(torch::logical_and(clipped, advantages < 0)), response_mask);
  return {pg_loss,
          {{"actor/pg_clipfrac", item(pg_clipfrac)},
           {"actor/ppo_kl", item(ppo_kl)},
           {"actor/pg_clipfrac_lower", item(pg_clipfrac_lower)}}};
}

PolicyLossOutput compute_policy_loss_cispo(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                           const at::Tensor& advantages, const at::Tensor& response_mask,
                                           const std::string& loss_agg_mode, const ActorConfig& config,
                                           const OptTensor& rollout_is_weights) {
  check_inputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights, "compute_policy_loss_cispo");
  auto negative_approx_kl = torch::clamp(log_prob - old_log_prob, -20.0, 20.0);
  auto ratio = torch::exp(negative_approx_kl);
  auto ppo_kl = masked_mean(-negative_approx_kl, response_mask);
  auto clipped_ratio = torch::clamp(ratio, 1 - clip_low(config), 1 + clip_high(config));
  // The clipped ratio is a constant weight: the gradient flows through log_prob only.
  auto pg_losses = -clipped_ratio.detach() * advantages * log_prob;
  auto pg_clipfrac = masked_mean(as_float(ratio != clipped_ratio), response_mask);
  pg_losses = apply_is_weights(pg_losses, rollout_is_weights);
  auto pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config);
  return {pg_loss,
          {{"actor/pg_clipfrac", item(pg_clipfrac)}, {"actor/ppo_kl", item(ppo_kl)}, {"actor/pg_clipfrac_lower", 0.0}}};
}

}  // namespace hyflow::algos::core_algos
