// verl's rollout correction IS weights and rollout_corr/* metrics (rollout_correction.hpp).
#include <hyflow/algos/rollout_correction.hpp>
#include <hyflow/core/error.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace hyflow::algos::rollout_correction {

namespace {
constexpr double kLogBound = 20.0;  // verl's safety bound: ratios within [e^-20, e^20]

double masked_mean(const at::Tensor& x, const at::Tensor& mask) {
  return ((x * mask).sum() / mask.sum().clamp_min(1)).item<double>();
}

void check_shapes(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob, const at::Tensor& response_mask) {
  if (old_log_prob.sizes() != rollout_log_prob.sizes() || old_log_prob.sizes() != response_mask.sizes() ||
      old_log_prob.dim() != 2) {
    std::ostringstream msg;
    msg << "rollout correction: old_log_probs " << old_log_prob.sizes() << ", rollout_log_probs "
        << rollout_log_prob.sizes() << " and response_mask " << response_mask.sizes() << " must be the same (B, T)";
    throw ShapeError(msg.str());
  }
}

/// old - rollout in double, unbounded (padding included: callers mask).
at::Tensor log_ratio_of(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob) {
  return old_log_prob.to(torch::kDouble) - rollout_log_prob.to(torch::kDouble);
}
}  // namespace

RolloutIsOutput compute_rollout_is_weights(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                           const at::Tensor& response_mask, const RolloutIsOptions& options) {
  check_shapes(old_log_prob, rollout_log_prob, response_mask);
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
  if (options.batch_normalize) {
    // the mean of the truncated weights: per valid token, or per row that has a valid token
    const auto rows = (mask.sum(-1) > 0).to(torch::kDouble);
    const double mean = options.level == "token"
                            ? masked_mean(weights, mask)
                            : ((weights * mask).sum(-1) / mask.sum(-1).clamp_min(1) * rows).sum().item<double>() /
                                  std::max(1.0, rows.sum().item<double>());
    const double factor = mean > 1e-8 ? mean : 1.0;
    weights = weights / factor;
    m[p + "rollout_is_batch_norm_factor"] = factor;
  }
  return {weights.to(torch::kFloat), std::move(m)};
}

RolloutMaskOutput compute_rollout_rejection_mask(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                                 const at::Tensor& response_mask, const RolloutRsOptions& options) {
  check_shapes(old_log_prob, rollout_log_prob, response_mask);
  const std::string& level = options.level;
  if (level != "token" && level != "sequence" && level != "geometric")
    throw ValueError("algorithm.rollout_correction.rollout_rs: '" + level + "' is not token, sequence or geometric");
  const double upper = options.threshold;
  const double lower = options.threshold_lower.value_or(1.0 / upper);
  if (!(upper > 0))
    throw ValueError("algorithm.rollout_correction.rollout_rs_threshold must be > 0, got " + std::to_string(upper));
  if (!(lower > 0) || lower > upper)
    throw ValueError("algorithm.rollout_correction.rollout_rs_threshold_lower must be in (0, rollout_rs_threshold = " +
                     std::to_string(upper) + "], got " + std::to_string(lower));
  const auto mask = response_mask.to(torch::kDouble);
  const auto valid = mask > 0;
  const auto log_ratio = log_ratio_of(old_log_prob, rollout_log_prob);
  const std::string p = "rollout_corr/";
  nlohmann::json m = nlohmann::json::object();
  at::Tensor ratio;  // (B, T): the ratio each token is judged by
  if (level == "token") {
    ratio = log_ratio.clamp(-kLogBound, kLogBound).exp();
    const auto counted = ratio.masked_select(valid);
    if (counted.numel() > 0) {
      m[p + "rollout_rs_max"] = counted.max().item<double>();
      m[p + "rollout_rs_min"] = counted.min().item<double>();
    }
    m[p + "rollout_rs_ratio_fraction_high"] = masked_mean((ratio > upper).to(torch::kDouble), mask);
    m[p + "rollout_rs_ratio_fraction_low"] = masked_mean((ratio < lower).to(torch::kDouble), mask);
  } else {
    auto row_log = (log_ratio * mask).sum(-1);  // (B,)
    if (level == "geometric") row_log = row_log / mask.sum(-1).clamp_min(1);
    ratio = row_log.clamp(-kLogBound, kLogBound).exp().unsqueeze(1).expand_as(mask);
    m[p + "rollout_rs_max"] = std::exp(std::min(row_log.max().item<double>(), kLogBound));
    m[p + "rollout_rs_min"] = std::exp(row_log.min().item<double>());
    m[p + "rollout_rs_ratio_fraction_high"] = (row_log > std::log(upper)).to(torch::kDouble).mean().item<double>();
    m[p + "rollout_rs_ratio_fraction_low"] = (row_log < std::log(lower)).to(torch::kDouble).mean().item<double>();
  }
  m[p + "rollout_rs_mean"] = masked_mean(ratio, mask);
  const auto keep = (ratio >= lower) & (ratio <= upper);
  const auto rejected = valid & ~keep;
  m[p + "rollout_rs_masked_fraction"] = masked_mean(rejected.to(torch::kDouble), mask);
  m[p + "rollout_rs_seq_masked_fraction"] = rejected.any(-1).to(torch::kDouble).mean().item<double>();
  return {response_mask * keep.to(response_mask.scalar_type()), std::move(m)};
}

RolloutMaskOutput compute_token_veto_mask(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                          const at::Tensor& response_mask, double threshold) {
  check_shapes(old_log_prob, rollout_log_prob, response_mask);
  if (!(threshold > 0))
    throw ValueError("algorithm.rollout_correction.rollout_token_veto_threshold must be > 0, got " +
                     std::to_string(threshold));
  const auto mask = response_mask.to(torch::kDouble);
  const auto catastrophic = (log_ratio_of(old_log_prob, rollout_log_prob) < std::log(threshold)) & (mask > 0);
  const auto vetoed = catastrophic.any(-1, /*keepdim=*/true);  // (B, 1)
  nlohmann::json m = nlohmann::json::object();
  m["rollout_corr/rollout_is_veto_fraction"] = vetoed.to(torch::kDouble).mean().item<double>();
  m["rollout_corr/rollout_is_catastrophic_token_fraction"] = masked_mean(catastrophic.to(torch::kDouble), mask);
  return {response_mask * (~vetoed).to(response_mask.scalar_type()), std::move(m)};
}

nlohmann::json apply_rollout_correction(DataProto& batch, const RolloutCorrection& correction) {
  nlohmann::json m = nlohmann::json::object();
  if (!correction.enabled()) return m;
  const at::Tensor old_lp = batch.batch.at("old_log_probs"), rollout_lp = batch.batch.at("rollout_log_probs");
  const at::Tensor mask = batch.batch.at("response_mask");
  if (correction.is) {
    auto r = compute_rollout_is_weights(old_lp, rollout_lp, mask, *correction.is);
    batch.batch.set("rollout_is_weights", r.weights);
    m.update(r.metrics);
  }
  at::Tensor kept = mask;
  if (correction.rs) {
    auto r = compute_rollout_rejection_mask(old_lp, rollout_lp, mask, *correction.rs);
    kept = r.response_mask;
    m.update(r.metrics);
  }
  if (correction.token_veto_threshold) {
    auto r = compute_token_veto_mask(old_lp, rollout_lp, mask, *correction.token_veto_threshold);
    kept = kept * r.response_mask;
    m.update(r.metrics);
  }
  if (kept.sum().item<int64_t>() == 0)
    throw ValueError(
        "algorithm.rollout_correction: rollout_rs / rollout_token_veto_threshold rejected every response "
        "token of the batch (" +
        m.dump() + "); loosen the thresholds");
  batch.batch.set("response_mask", kept);
  return m;
}

}  // namespace hyflow::algos::rollout_correction
