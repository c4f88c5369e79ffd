// Loss aggregation (verl agg_loss) and the value / entropy losses built on it.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include <torch/torch.h>

#include <string>

namespace hyflow::algos::core_algos {
namespace {

/// A count used as a divisor; 0 (an all-masked micro-batch) becomes 1 so the loss is 0, not NaN.
at::Tensor nonzero_count(const at::Tensor& count) {
  return torch::where(count == 0, torch::ones_like(count), count);
}

}  // namespace

at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& loss_mask, const std::string& loss_agg_mode,
                    int64_t dp_size, std::optional<double> batch_num_tokens, std::optional<double> global_batch_size,
                    std::optional<double> loss_scale_factor) {
  if (loss_mat.sizes() != loss_mask.sizes()) {
    throw ShapeError("agg_loss: loss_mat " + c10::str(loss_mat.sizes()) + " and loss_mask " +
                     c10::str(loss_mask.sizes()) + " differ");
  }
  if (loss_agg_mode == "token-mean") {
    auto total = masked_sum(loss_mat, loss_mask);
    if (batch_num_tokens) return total / *batch_num_tokens * dp_size;
    return total / nonzero_count(loss_mask.sum()) * dp_size;
  }
  if (loss_agg_mode == "seq-mean-token-sum" || loss_agg_mode == "seq-mean-token-mean") {
    auto seq_count = loss_mask.sum(-1);
    auto seq_losses = (loss_mat * loss_mask).sum(-1);
    if (loss_agg_mode == "seq-mean-token-mean") seq_losses = seq_losses / (seq_count + 1e-8);
    auto seq_mask = (seq_count > 0).to(torch::kFloat);  // fully masked sequences do not count
    auto total = masked_sum(seq_losses, seq_mask);
    if (global_batch_size) return total / *global_batch_size * dp_size;
    return total / nonzero_count(seq_mask.sum()) * dp_size;
  }
  if (loss_agg_mode == "seq-mean-token-sum-norm") {
    auto seq_losses = (loss_mat * loss_mask).sum(-1);
    const double factor = loss_scale_factor.value_or(static_cast<double>(loss_mask.size(-1)));
    return seq_losses.sum() / factor;
  }
  throw ValueError("agg_loss: invalid loss_agg_mode '" + loss_agg_mode +
                   "' (token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm)");
}

ValueLossOutput compute_value_loss(const at::Tensor& vpreds, const at::Tensor& returns, const at::Tensor& values,
                                   const at::Tensor& response_mask, double cliprange_value,
                                   const std::string& loss_agg_mode, const GlobalBatchInfo& global_batch_info,
                                   std::optional<double> loss_scale_factor) {
  if (vpreds.sizes() != returns.sizes() || vpreds.sizes() != values.sizes() ||
      vpreds.sizes() != response_mask.sizes()) {
    throw ShapeError("compute_value_loss: vpreds " + c10::str(vpreds.sizes()) + ", returns " +
                     c10::str(returns.sizes()) + ", values " + c10::str(values.sizes()) + ", response_mask " +
                     c10::str(response_mask.sizes()) + " must all have the same shape");
  }
  auto vpredclipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value);
  auto vf_losses1 = (vpreds - returns).pow(2);
  auto vf_losses2 = (vpredclipped - returns).pow(2);
  auto clipped_vf_losses = torch::max(vf_losses1, vf_losses2);
  auto vf_loss = 0.5 * agg_loss(clipped_vf_losses, response_mask, loss_agg_mode, global_batch_info.dp_size,
                                global_batch_info.batch_num_tokens, global_batch_info.global_batch_size,
                                loss_scale_factor);
  auto vf_clipfrac = masked_mean(torch::gt(vf_losses2, vf_losses1).to(torch::kFloat), response_mask);
  return {vf_loss, vf_clipfrac};
}

at::Tensor compute_entropy_loss(const at::Tensor& logits, const at::Tensor& response_mask,
                                const std::string& loss_agg_mode) {
  auto token_entropy = entropy_from_logits(logits);
  return agg_loss(token_entropy, response_mask, loss_agg_mode);
}

}  // namespace hyflow::algos::core_algos
