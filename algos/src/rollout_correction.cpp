// verl's rollout correction IS weights and rollout_corr/* metrics (rollout_correction.hpp).
#include <hyflow/algos/rollout_correction.hpp>
#include <hyflow/core/error.hpp>

#include <torch/torch.h>

#include <sstream>

namespace hyflow::algos::rollout_correction {

namespace {
constexpr double kLogBound = 20.0;  // verl's safety bound: ratios within [e^-20, e^20]

double masked_mean(const at::Tensor& x, const at::Tensor& mask) {
  return ((x * mask).sum() / mask.sum().clamp_min(1)).item<double>();
}
}  // namespace

RolloutIsOutput compute_rollout_is_weights(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                           const at::Tensor& response_mask, const RolloutIsOptions& options) {
  if (old_log_prob.sizes() != rollout_log_prob.sizes() || old_log_prob.sizes() != response_mask.sizes() ||
      old_log_prob.dim() != 2) {
    std::ostringstream msg;
    msg << "rollout correction: old_log_probs " << old_log_prob.sizes() << ", rollout_log_probs "
        << rollout_log_prob.sizes() << " and response_mask " << response_mask.sizes() << " must be the same (B, T)";
    throw ShapeError(msg.str());
  }
  if (options.level != "token" && options.level != "sequence")
    throw ValueError("algorithm.rollout_correction.rollout_is: '" + options.level + "' is not token or sequence");
  if (!(options.threshold > 0))
    throw ValueError("algorithm.rollout_correction.rollout_is_threshold must be > 0, got " +
                     std::to_string(options.threshold));
  const auto mask = response_mask.to(torch::kDouble);
  const auto old_lp = old_log_prob.to(torch::kDouble), rollout_lp = rollout_log_prob.to(torch::kDouble);
  const auto log_ratio = (old_lp - rollout_lp) * mask;  // (B, T), 0 on padding
  const auto token_ratio = log_ratio.clamp(-kLogBound, kLogBound).exp();

  at::Tensor raw;      // per token (B, T) or per row (B,)
  at::Tensor weights;  // (B, T)
  nlohmann::json m = nlohmann::json::object();
  const std::string p = "rollout_corr/";
  auto stats = [&](const at::Tensor& values) {  // values: the weights that count (flat)
    const auto mean = values.mean();
    m[p + "rollout_is_mean"] = mean.item<double>();
    m[p + "rollout_is_std"] = values.numel() > 1 ? values.std().item<double>() : 0.0;
    m[p + "rollout_is_min"] = values.min().item<double>();
    m[p + "rollout_is_max"] = values.max().item<double>();
    m[p + "rollout_is_eff_sample_size"] = (mean * mean / (values * values).mean()).item<double>();
  };
  const auto valid = mask > 0;
  if (options.level == "token") {
    raw = token_ratio;
    weights = raw.clamp_max(options.threshold) * mask;
    const auto counted = weights.masked_select(valid);
    if (counted.numel() > 0) {
      stats(counted);
      m[p + "rollout_is_ratio_fraction_high"] =
          (raw.masked_select(valid) > options.threshold).to(torch::kDouble).mean().item<double>();
    }
  } else {
    raw = log_ratio.sum(-1).clamp(-kLogBound, kLogBound).exp();  // (B,)
    const auto row_weights = raw.clamp_max(options.threshold);
    weights = row_weights.unsqueeze(1) * mask;
    stats(row_weights);
    m[p + "rollout_is_ratio_fraction_high"] = (raw > options.threshold).to(torch::kDouble).mean().item<double>();
  }
  m[p + "kl"] = masked_mean(rollout_lp - old_lp, mask);
  m[p + "k3_kl"] = masked_mean(token_ratio - log_ratio - 1, mask);
  m[p + "chi2_token"] = masked_mean(token_ratio * token_ratio, mask) - 1;
  const auto lengths = mask.sum(-1).clamp_min(1);
  const auto training_log_ppl = -(old_lp * mask).sum(-1) / lengths;
  const auto rollout_log_ppl = -(rollout_lp * mask).sum(-1) / lengths;
  m[p + "training_ppl"] = training_log_ppl.exp().mean().item<double>();
  m[p + "rollout_ppl"] = rollout_log_ppl.exp().mean().item<double>();
  m[p + "log_ppl_diff"] = (rollout_log_ppl - training_log_ppl).mean().item<double>();
  return {weights.to(torch::kFloat), std::move(m)};
}

}  // namespace hyflow::algos::rollout_correction
