#pragma once
// verl's rollout correction (algorithm.rollout_correction, decoupled mode): importance-sampling
// weights π_old / π_rollout between the policy the trainer recomputes (old_log_probs) and the
// policy that generated the rows (rollout_log_probs: an older weight version in asynchronous
// training, another engine or precision elsewhere), truncated from above, plus verl's
// rollout_corr/* diagnostics. The actor multiplies its per-token policy loss by the weights.

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace hyflow::algos::rollout_correction {

struct RolloutIsOptions {
  /// "token": ρ_t = exp(old_t - rollout_t) per token; "sequence": ρ = exp(Σ_t (old_t - rollout_t))
  /// over the row's valid tokens, broadcast to them.
  std::string level = "token";
  /// Upper truncation of the weights (verl's rollout_is_threshold): w = min(ρ, threshold).
  double threshold = 2.0;
};

struct RolloutIsOutput {
  at::Tensor weights;       ///< (B, T) float: truncated weights, 0 on padding
  nlohmann::json metrics;   ///< rollout_corr/* (see compute_rollout_is_weights)
};

/// The weights and verl's metrics: rollout_corr/rollout_is_{mean,std,min,max} (over valid tokens
/// for "token", over rows for "sequence"; after truncation), rollout_is_eff_sample_size
/// ((mean w)² / mean w², in (0, 1]), rollout_is_ratio_fraction_high (share above the threshold
/// before truncation), and the off-policy diagnostics kl (mean of rollout - old over valid
/// tokens), k3_kl (mean of e^r - r - 1, r = old - rollout), chi2_token (mean ρ² - 1),
/// training_ppl / rollout_ppl (mean over rows of exp(-mean log-prob)) and log_ppl_diff
/// (mean over rows of rollout - training log perplexity). Log ratios are bounded to [-20, 20]
/// before exponentiating, as in verl. ShapeError on mismatched shapes, ValueError on an unknown
/// level or a threshold <= 0.
RolloutIsOutput compute_rollout_is_weights(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                           const at::Tensor& response_mask, const RolloutIsOptions& options);

}  // namespace hyflow::algos::rollout_correction
