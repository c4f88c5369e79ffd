// KL estimators, KL controllers and the in-reward KL penalty (verl core_algos.py and
// ray_trainer.apply_kl_penalty).
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <string>

namespace hyflow::algos::core_algos {
namespace {

at::Tensor kl_penalty_forward(const at::Tensor& logprob, const at::Tensor& ref_logprob, const std::string& type) {
  if (type == "kl" || type == "k1") return logprob - ref_logprob;
  if (type == "abs") return (logprob - ref_logprob).abs();
  if (type == "mse" || type == "k2") return 0.5 * (logprob - ref_logprob).square();
  if (type == "low_var_kl" || type == "k3") {
    // Schulman's k3 = e^d - d - 1 with d = ref - logp; both clamps stop the gradient outside.
    auto kl = torch::clamp(ref_logprob - logprob, -20, 20);
    auto ratio = torch::exp(kl);
    auto kld = (ratio - kl - 1).contiguous();
    return torch::clamp(kld, -10, 10);
  }
  if (type == "full") {
    throw ValueError("kl_penalty: 'full' (KL over the whole vocabulary) is not implemented, as in verl");
  }
  throw ValueError("kl_penalty: unknown estimator '" + type +
                   "' (kl, k1, abs, mse, k2, low_var_kl, k3, optionally with a trailing '+')");
}

}  // namespace

at::Tensor kl_penalty(const at::Tensor& logprob, const at::Tensor& ref_logprob, const std::string& kl_penalty) {
  if (logprob.sizes() != ref_logprob.sizes()) {
    throw ShapeError("kl_penalty: logprob " + c10::str(logprob.sizes()) + " and ref_logprob " +
                     c10::str(ref_logprob.sizes()) + " differ");
  }
  const bool straight_through = !kl_penalty.empty() && kl_penalty.back() == '+';
  const std::string base = straight_through ? kl_penalty.substr(0, kl_penalty.size() - 1) : kl_penalty;
  auto forward_score = kl_penalty_forward(logprob, ref_logprob, base);
  if (!straight_through || base == "mse" || base == "k2") return forward_score;
  // Value of the chosen estimator, gradient of k2 (unbiased KL gradient).
  auto backward_score = 0.5 * (logprob - ref_logprob).square();
  return backward_score - backward_score.detach() + forward_score.detach();
}

at::Tensor compute_rewards(const at::Tensor& token_level_scores, const at::Tensor& old_log_prob,
                           const at::Tensor& ref_log_prob, double kl_ratio) {
  auto kl = old_log_prob - ref_log_prob;
  return token_level_scores - kl * kl_ratio;
}

AdaptiveKLController::AdaptiveKLController(double init_kl_coef, double target_kl, double horizon)
    : target(target_kl), horizon(horizon) {
  value = init_kl_coef;
}

void AdaptiveKLController::update(double current_kl, int64_t n_steps) {
  const double proportional_error = std::clamp(current_kl / target - 1, -0.2, 0.2);
  const double mult = 1 + proportional_error * static_cast<double>(n_steps) / horizon;
  value *= mult;
}

std::unique_ptr<KLController> get_kl_controller(const KLControlConfig& kl_ctrl) {
  if (kl_ctrl.type == "fixed") return std::make_unique<FixedKLController>(kl_ctrl.kl_coef);
  if (kl_ctrl.type == "adaptive") {
    if (!(kl_ctrl.horizon > 0)) {
      throw ValueError("get_kl_controller: kl_ctrl.horizon must be > 0, got " + std::to_string(kl_ctrl.horizon));
    }
    return std::make_unique<AdaptiveKLController>(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon);
  }
  throw ValueError("get_kl_controller: unknown kl_ctrl.type '" + kl_ctrl.type + "' (fixed, adaptive)");
}

std::map<std::string, double> apply_kl_penalty(DataProto& data, KLController& kl_ctrl,
                                               const std::string& kl_penalty_type) {
  const auto& response_mask = data.batch.at("response_mask");
  const auto& token_level_scores = data.batch.at("token_level_scores");
  const int64_t batch_size = response_mask.size(0);
  auto kld = kl_penalty(data.batch.at("old_log_probs"), data.batch.at("ref_log_prob"), kl_penalty_type) *
             response_mask;
  const double beta = kl_ctrl.value;
  auto token_level_rewards = token_level_scores - beta * kld;
  const double current_kl = masked_mean(kld, response_mask, -1).mean(0).item<double>();
  kl_ctrl.update(current_kl, batch_size);
  data.batch.set("token_level_rewards", token_level_rewards);
  return {{"actor/reward_kl_penalty", current_kl}, {"actor/reward_kl_penalty_coeff", beta}};
}

}  // namespace hyflow::algos::core_algos
