// Optimal token baseline (verl core_algos.py, OTB and its multi-turn "TIR" variant).
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include <torch/torch.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace hyflow::algos::core_algos {
namespace {

void check_inputs(const at::Tensor& rewards, const at::Tensor& mask, const at::Tensor& old_log_probs,
                  const at::Tensor& sum_pi_squared, const std::optional<at::Tensor>& is_weights,
                  const std::vector<std::string>& index, const char* fn) {
  auto check = [&](const at::Tensor& t, const char* name) {
    if (t.dim() != 2 || t.sizes() != rewards.sizes()) {
      throw ShapeError(std::string(fn) + ": " + name + " " + c10::str(t.sizes()) +
                       " must match token_level_rewards (bs, response_length) " + c10::str(rewards.sizes()));
    }
  };
  check(rewards, "token_level_rewards");
  check(mask, "response_mask");
  check(old_log_probs, "old_log_probs");
  check(sum_pi_squared, "sum_pi_squared");
  if (is_weights) check(*is_weights, "rollout_is_weights");
  if (static_cast<int64_t>(index.size()) != rewards.size(0)) {
    throw ShapeError(std::string(fn) + ": index has " + std::to_string(index.size()) + " entries, batch has " +
                     std::to_string(rewards.size(0)) + " rows");
  }
}

/// W_t = cumsum over valid tokens of (1 - 2π_t + Σπ²)·ρ² (ρ = rollout IS weight when given).
at::Tensor cumulative_path_variance(const at::Tensor& mask, const at::Tensor& old_log_probs,
                                    const at::Tensor& sum_pi_squared, const std::optional<at::Tensor>& is_weights) {
  auto w = 1 - 2 * torch::exp(old_log_probs) + sum_pi_squared;
  if (is_weights) w = w * is_weights->pow(2);
  return (w * mask).cumsum(-1);
}

/// Rows per uid in order of first appearance, optionally skipping some rows.
std::vector<std::vector<int64_t>> groups_of(const std::vector<std::string>& index, const std::vector<bool>& skip) {
  std::unordered_map<std::string, size_t> slot;
  std::vector<std::vector<int64_t>> groups;
  for (size_t i = 0; i < index.size(); ++i) {
    if (skip[i]) continue;
    auto [it, fresh] = slot.try_emplace(index[i], groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(static_cast<int64_t>(i));
  }
  return groups;
}

at::Tensor long_tensor(const std::vector<int64_t>& v, const at::Device& device) {
  return torch::tensor(v, torch::TensorOptions().dtype(torch::kLong)).to(device);
}

/// The longest trajectory's tail past the second-longest has no peers: zero its baseline.
void zero_unique_longest_tail(at::Tensor& baselines, const at::Tensor& lengths, const std::vector<int64_t>& rows) {
  auto sorted = std::get<0>(torch::sort(lengths));
  const auto max_length = static_cast<int64_t>(sorted[-1].item<double>());
  const auto second_max_length = static_cast<int64_t>(sorted[-2].item<double>());
  auto max_idx = (lengths == max_length).nonzero().reshape(-1);
  if (max_idx.numel() == 1 && max_length > second_max_length) {
    baselines[rows[max_idx[0].item<int64_t>()]].slice(0, second_max_length).zero_();
  }
}

}  // namespace

AdvantageOutput compute_optimal_token_baseline_advantage(const at::Tensor& token_level_rewards,
                                                         const at::Tensor& response_mask,
                                                         const std::vector<std::string>& index,
                                                         const at::Tensor& old_log_probs,
                                                         const at::Tensor& sum_pi_squared,
                                                         const std::optional<at::Tensor>& rollout_is_weights,
                                                         bool handle_zero_tail, double epsilon) {
  check_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights, index,
               "compute_optimal_token_baseline_advantage");
  torch::NoGradGuard no_grad;
  auto returns = (token_level_rewards * response_mask).flip({-1}).cumsum(-1).flip({-1});
  auto w_cumulative = cumulative_path_variance(response_mask, old_log_probs, sum_pi_squared, rollout_is_weights);
  auto baselines = torch::zeros_like(returns);
  for (const auto& rows : groups_of(index, std::vector<bool>(index.size(), false))) {
    const auto n = static_cast<int64_t>(rows.size());
    if (n == 1) continue;  // no baseline: advantage = return
    auto traj_idx = long_tensor(rows, returns.device());
    auto returns_group = returns.index_select(0, traj_idx);
    auto w_group = w_cumulative.index_select(0, traj_idx);
    auto mask_group = response_mask.index_select(0, traj_idx);
    // B_t = Σ_i G_t·W_t / (Σ_i W_t + ε) over the group's valid tokens at step t
    auto numerator = (returns_group * w_group * mask_group).sum(0);
    auto denominator = (w_group * mask_group).sum(0) + epsilon;
    auto baseline = (numerator / denominator).unsqueeze(0).expand({n, -1});
    baselines.index_copy_(0, traj_idx, baseline.to(baselines.scalar_type()));
    if (handle_zero_tail) zero_unique_longest_tail(baselines, mask_group.sum(-1), rows);
  }
  auto advantages = (returns - baselines) * response_mask;
  return {advantages, returns};
}

AdvantageOutput compute_multi_turn_optimal_token_baseline_advantage(
    const at::Tensor& token_level_rewards, const at::Tensor& response_mask, const std::vector<std::string>& index,
    const at::Tensor& old_log_probs, const at::Tensor& sum_pi_squared,
    const std::optional<at::Tensor>& rollout_is_weights, bool handle_zero_tail, double epsilon) {
  check_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights, index,
               "compute_multi_turn_optimal_token_baseline_advantage");
  torch::NoGradGuard no_grad;
  auto token_returns = (token_level_rewards * response_mask).flip({-1}).cumsum(-1).flip({-1});
  auto w_cumulative = cumulative_path_variance(response_mask, old_log_probs, sum_pi_squared, rollout_is_weights);

  // Compact each row's valid tokens to the front: (bs, T) -> (bs, max_length).
  const int64_t bs = token_returns.size(0);
  auto lengths = response_mask.sum(-1).to(torch::kLong);
  const int64_t max_length = bs > 0 ? lengths.max().item<int64_t>() : 0;
  auto all_w = torch::zeros({bs, max_length}, w_cumulative.options());
  auto all_returns = torch::zeros_like(all_w);
  std::vector<at::Tensor> valid(bs);
  std::vector<bool> empty(bs);
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t length = lengths[i].item<int64_t>();
    empty[i] = length == 0;
    if (empty[i]) continue;
    valid[i] = response_mask[i].to(torch::kBool);
    all_w[i].slice(0, 0, length).copy_(w_cumulative[i].masked_select(valid[i]));
    all_returns[i].slice(0, 0, length).copy_(token_returns[i].masked_select(valid[i]));
  }

  auto baselines = torch::zeros_like(all_returns);
  for (const auto& rows : groups_of(index, empty)) {
    if (rows.size() == 1) continue;  // baseline 0: advantage = return
    auto traj_idx = long_tensor(rows, all_returns.device());
    auto w_group = all_w.index_select(0, traj_idx);
    auto returns_group = all_returns.index_select(0, traj_idx);
    auto b_star = (returns_group * w_group).sum(0) / (w_group.sum(0) + epsilon);
    baselines.index_copy_(
        0, traj_idx, b_star.to(baselines.scalar_type()).unsqueeze(0).expand({static_cast<int64_t>(rows.size()), -1}));
    if (handle_zero_tail) zero_unique_longest_tail(baselines, lengths.index_select(0, traj_idx), rows);
  }

  auto all_advantages = all_returns - baselines;
  auto advantages = torch::zeros_like(token_returns);
  for (int64_t i = 0; i < bs; ++i) {
    if (empty[i]) continue;
    auto row = advantages[i];
    row.masked_scatter_(valid[i], all_advantages[i].slice(0, 0, lengths[i].item<int64_t>()).to(row.scalar_type()));
  }
  advantages = advantages * response_mask;
  return {advantages, token_returns};
}

}  // namespace hyflow::algos::core_algos
