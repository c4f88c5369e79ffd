#pragma once
// verl's rollout correction (algorithm.rollout_correction, decoupled mode): importance-sampling
// weights π_old / π_rollout between the policy the trainer recomputes (old_log_probs) and the
// policy that generated the rows (rollout_log_probs: an older weight version in asynchronous
// training, another engine or precision elsewhere), truncated from above, plus verl's
// rollout_corr/* diagnostics. The actor multiplies its per-token policy loss by the weights.

#include <hyflow/dataproto/data_proto.hpp>

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
  /// verl's rollout_is_batch_normalize: after truncation, divide the weights by their batch mean
  /// (over valid tokens for "token", over rows with a valid token for "sequence") so they average 1.
  bool batch_normalize = false;
};

struct RolloutIsOutput {
  at::Tensor weights;      ///< (B, T) float: truncated weights, 0 on padding
  nlohmann::json metrics;  ///< rollout_corr/* (see compute_rollout_is_weights)
};

/// The weights and verl's metrics: rollout_corr/rollout_is_{mean,std,min,max} (over valid tokens
/// for "token", over rows for "sequence"; after truncation), rollout_is_eff_sample_size
/// ((mean w)² / mean w², in (0, 1]), rollout_is_ratio_fraction_high (share above the threshold
/// before truncation), and the off-policy diagnostics kl (mean of rollout - old over valid
/// tokens), k3_kl (mean of e^r - r - 1, r = old - rollout), chi2_token (mean ρ² - 1),
/// training_ppl / rollout_ppl (mean over rows of exp(-mean log-prob)) and log_ppl_diff
/// (mean over rows of rollout - training log perplexity). Log ratios are bounded to [-20, 20]
/// before exponentiating, as in verl. ShapeError on mismatched shapes, ValueError on an unknown
/// level or a threshold <= 0. With batch_normalize the statistics are those before normalising and
/// rollout_corr/rollout_is_batch_norm_factor is the mean divided by (1 when it is not above 1e-8).
RolloutIsOutput compute_rollout_is_weights(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                           const at::Tensor& response_mask, const RolloutIsOptions& options);

/// verl's rejection sampling (algorithm.rollout_correction.rollout_rs*): the ratio ρ = π_old / π_rollout
/// at a level, and every valid token whose ratio lies outside [threshold_lower, threshold] leaves the
/// response mask.
struct RolloutRsOptions {
  /// "token": ρ_t per token; "sequence": exp(Σ_t log ρ_t) of the row on all its tokens; "geometric":
  /// exp(mean_t log ρ_t), the geometric mean of the row's token ratios, on all its tokens.
  std::string level = "token";
  /// Upper bound (verl's rollout_rs_threshold, required).
  double threshold = 2.0;
  /// Lower bound (verl's rollout_rs_threshold_lower; null: 1 / threshold).
  std::optional<double> threshold_lower;
};

struct RolloutMaskOutput {
  at::Tensor response_mask;  ///< the input mask with the rejected tokens set to 0 (its dtype)
  nlohmann::json metrics;    ///< rollout_corr/* (see the functions)
};

/// Rejection mask and verl's metrics: rollout_corr/rollout_rs_{mean,max,min} (of the ratios over valid
/// tokens; for sequence and geometric max and min are over rows, from the unbounded log ratio),
/// rollout_rs_ratio_fraction_{high,low} (share of valid tokens, of rows for sequence and geometric,
/// above the upper or below the lower bound), rollout_rs_masked_fraction (rejected share of the valid
/// tokens) and rollout_rs_seq_masked_fraction (share of rows with a rejected token). Log ratios are
/// bounded to ±20 before exponentiating. ShapeError on mismatched shapes; ValueError naming the key on
/// an unknown level, a bound <= 0 or a lower bound above the upper one.
RolloutMaskOutput compute_rollout_rejection_mask(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                                 const at::Tensor& response_mask, const RolloutRsOptions& options);

/// verl's per-token veto (algorithm.rollout_correction.rollout_token_veto_threshold): a row with any
/// valid token whose ratio π_old / π_rollout (unbounded) is below `threshold` is rejected whole (its
/// mask row set to 0). Metrics: rollout_corr/rollout_is_veto_fraction (share of rows vetoed) and
/// rollout_corr/rollout_is_catastrophic_token_fraction (share of valid tokens below the threshold).
/// ShapeError on mismatched shapes, ValueError when threshold <= 0.
RolloutMaskOutput compute_token_veto_mask(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                          const at::Tensor& response_mask, double threshold);

/// The settings of algorithm.rollout_correction that act on a batch (unset: off).
struct RolloutCorrection {
  std::optional<RolloutIsOptions> is;
  std::optional<RolloutRsOptions> rs;
  std::optional<double> token_veto_threshold;
  bool enabled() const { return is || rs || token_veto_threshold; }
};

/// verl's rollout correction of a batch after its old log-probs (old_log_probs, rollout_log_probs,
/// response_mask): with `is`, the truncated IS weights as rollout_is_weights (decoupled mode: the
/// actor multiplies its per-token loss by them); with `rs` and the veto, the rejected tokens and
/// vetoed rows leave response_mask (no advantage, no loss, not counted). Returns the
/// rollout_corr/* metrics. ValueError when every response token of the batch is rejected.
nlohmann::json apply_rollout_correction(DataProto& batch, const RolloutCorrection& correction);

}  // namespace hyflow::algos::rollout_correction
