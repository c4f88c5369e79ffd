// Advantage estimators (verl core_algos.py). Group statistics are computed with the same
// 0-dim tensor ops as verl so dtype promotion (float32 singleton μ/σ, float32 GPG α) matches.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include <torch/torch.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace hyflow::algos::core_algos {
namespace {

using Index = std::vector<std::string>;

void check_rewards_and_mask(const at::Tensor& rewards, const at::Tensor& mask, const char* fn) {
  if (rewards.dim() != 2) {
    throw ShapeError(std::string(fn) + ": token_level_rewards must be (bs, response_length), got " +
                     c10::str(rewards.sizes()));
  }
  if (rewards.sizes() != mask.sizes()) {
    throw ShapeError(std::string(fn) + ": token_level_rewards " + c10::str(rewards.sizes()) +
                     " and response_mask " + c10::str(mask.sizes()) + " differ");
  }
}

void check_same(const at::Tensor& a, const at::Tensor& ref, const char* fn, const char* name) {
  if (a.sizes() != ref.sizes()) {
    throw ShapeError(std::string(fn) + ": " + name + " " + c10::str(a.sizes()) + " must match token_level_rewards " +
                     c10::str(ref.sizes()));
  }
}

/// Rows of each uid, in order of first appearance (a Python dict of lists).
std::vector<std::vector<int64_t>> group_rows(const Index& index, int64_t bsz, const char* fn) {
  if (static_cast<int64_t>(index.size()) != bsz) {
    throw ShapeError(std::string(fn) + ": index has " + std::to_string(index.size()) + " entries, batch has " +
                     std::to_string(bsz) + " rows");
  }
  std::unordered_map<std::string, size_t> slot;
  std::vector<std::vector<int64_t>> groups;
  for (int64_t i = 0; i < bsz; ++i) {
    auto [it, fresh] = slot.try_emplace(index[i], groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  return groups;
}

/// torch.stack([scores[i] for i in rows])
at::Tensor gather_rows(const at::Tensor& scores, const std::vector<int64_t>& rows) {
  return scores.index_select(0, torch::tensor(rows, torch::TensorOptions().dtype(torch::kLong)).to(scores.device()));
}

at::Tensor f32_scalar(double v, const at::Tensor& like) {
  return torch::scalar_tensor(v, torch::TensorOptions().dtype(torch::kFloat).device(like.device()));
}

at::Tensor reverse_cumsum(const at::Tensor& x) { return x.flip({-1}).cumsum(-1).flip({-1}); }

}  // namespace

AdvantageOutput compute_gae_advantage_return(const at::Tensor& token_level_rewards, const at::Tensor& values,
                                             const at::Tensor& response_mask, double gamma, double lam) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_gae_advantage_return");
  check_same(values, token_level_rewards, "compute_gae_advantage_return", "values");
  torch::NoGradGuard no_grad;
  const int64_t gen_len = token_level_rewards.size(-1);
  auto nextvalues = torch::zeros_like(values.select(1, 0));
  auto lastgaelam = torch::zeros_like(values.select(1, 0));
  std::vector<at::Tensor> reversed;
  reversed.reserve(gen_len);
  for (int64_t t = gen_len - 1; t >= 0; --t) {
    auto m = response_mask.select(1, t);
    auto v = values.select(1, t);
    auto delta = token_level_rewards.select(1, t) + gamma * nextvalues - v;
    auto lastgaelam_new = delta + gamma * lam * lastgaelam;
    // Masked-out (observation) tokens carry the next value and advantage through unchanged.
    nextvalues = v * m + (1 - m) * nextvalues;
    lastgaelam = lastgaelam_new * m + (1 - m) * lastgaelam;
    reversed.push_back(lastgaelam);
  }
  std::reverse(reversed.begin(), reversed.end());
  auto advantages = torch::stack(reversed, 1);
  auto returns = advantages + values;
  advantages = masked_whiten(advantages, response_mask);
  return {advantages, returns};
}

AdvantageOutput compute_grpo_outcome_advantage(const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                                               const Index& index, double epsilon, bool norm_adv_by_std_in_grpo) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_grpo_outcome_advantage");
  torch::NoGradGuard no_grad;
  auto scores = token_level_rewards.sum(-1);
  const auto groups = group_rows(index, scores.size(0), "compute_grpo_outcome_advantage");
  std::vector<at::Tensor> mean(groups.size()), stdev(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].size() == 1) {
      mean[g] = f32_scalar(0.0, scores);
      stdev[g] = f32_scalar(1.0, scores);
    } else {
      auto group_scores = gather_rows(scores, groups[g]);
      mean[g] = group_scores.mean();
      stdev[g] = group_scores.std();  // unbiased (N - 1)
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int64_t i : groups[g]) {
      auto row = scores[i];
      if (norm_adv_by_std_in_grpo) {
        row.copy_((row - mean[g]) / (stdev[g] + epsilon));
      } else {
        row.copy_(row - mean[g]);
      }
    }
  }
  auto advantages = scores.unsqueeze(-1) * response_mask;
  return {advantages, advantages};
}

AdvantageOutput compute_grpo_vectorized_outcome_advantage(const at::Tensor& token_level_rewards,
                                                          const at::Tensor& response_mask, const Index& index,
                                                          double epsilon, bool norm_adv_by_std_in_grpo) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_grpo_vectorized_outcome_advantage");
  torch::NoGradGuard no_grad;
  auto scores = token_level_rewards.sum(-1);
  const auto groups = group_rows(index, scores.size(0), "compute_grpo_vectorized_outcome_advantage");
  std::vector<int64_t> gid(scores.size(0));
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int64_t i : groups[g]) gid[i] = static_cast<int64_t>(g);
  }
  auto g = torch::tensor(gid, torch::TensorOptions().dtype(torch::kLong)).to(scores.device());
  const auto num_groups = static_cast<int64_t>(groups.size());
  // verl's group_mean_std: float32 sums, Bessel with max(count-1, 1), σ = sqrt(max(var, eps)).
  auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(scores.device());
  auto s = scores.reshape(-1).to(torch::kFloat);
  auto count = torch::zeros({num_groups}, f32).index_add_(0, g, torch::ones_like(s));
  auto s1 = torch::zeros({num_groups}, f32).index_add_(0, g, s);
  auto s2 = torch::zeros({num_groups}, f32).index_add_(0, g, s * s);
  auto mean_g = s1 / count.clamp_min(1.0);
  auto var = (s2 - (s1 * s1) / count.clamp_min(1.0)) / (count - 1.0).clamp_min(1.0);
  auto std_g = torch::sqrt(torch::clamp(var, epsilon));
  auto single = count <= 1.0;
  mean_g = mean_g.masked_fill(single, 0.0);
  std_g = std_g.masked_fill(single, 1.0);
  auto scalars = norm_adv_by_std_in_grpo ? (scores - mean_g.index_select(0, g)) / (std_g.index_select(0, g) + epsilon)
                                         : scores - mean_g.index_select(0, g);
  auto advantages = scalars.unsqueeze(-1) * response_mask;
  return {advantages, advantages};
}

AdvantageOutput compute_grpo_passk_outcome_advantage(const at::Tensor& token_level_rewards,
                                                     const at::Tensor& response_mask, const Index& index,
                                                     double epsilon, bool norm_adv_by_std_in_grpo) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_grpo_passk_outcome_advantage");
  torch::NoGradGuard no_grad;
  auto scores = token_level_rewards.sum(-1);
  auto advantages = torch::zeros_like(scores);
  const auto groups = group_rows(index, scores.size(0), "compute_grpo_passk_outcome_advantage");
  for (const auto& rows : groups) {
    if (rows.size() < 2) {
      throw ValueError("compute_grpo_passk_outcome_advantage: Pass@k requires at least 2 samples per group, group '" +
                       index[rows.front()] + "' has " + std::to_string(rows.size()));
    }
    auto rewards = gather_rows(scores, rows);
    auto [topk, topk_idx] = torch::topk(rewards, 2);
    const int64_t i_max = rows[topk_idx[0].item<int64_t>()];
    auto advantage = topk[0] - topk[1];
    if (norm_adv_by_std_in_grpo) advantage = advantage / (rewards.std() + epsilon);
    advantages[i_max].copy_(advantage);
  }
  advantages = advantages.unsqueeze(-1) * response_mask;
  return {advantages, advantages};
}

AdvantageOutput compute_rloo_outcome_advantage(const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                                               const Index& index, double /*epsilon*/) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_rloo_outcome_advantage");
  torch::NoGradGuard no_grad;
  auto scores = token_level_rewards.sum(-1);
  const auto groups = group_rows(index, scores.size(0), "compute_rloo_outcome_advantage");
  for (const auto& rows : groups) {
    const auto n = static_cast<int64_t>(rows.size());
    if (n == 1) continue;  // a lone response keeps its raw score
    auto mean = gather_rows(scores, rows).mean();
    for (int64_t i : rows) {
      auto row = scores[i];
      row.copy_(row * n / (n - 1) - mean * n / (n - 1));
    }
  }
  auto advantages = scores.unsqueeze(-1) * response_mask;
  return {advantages, advantages};
}

AdvantageOutput compute_rloo_vectorized_outcome_advantage(const at::Tensor& token_level_rewards,
                                                          const at::Tensor& response_mask, const Index& index,
                                                          double /*epsilon*/) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_rloo_vectorized_outcome_advantage");
  torch::NoGradGuard no_grad;
  auto scores = token_level_rewards.sum(-1);
  const auto groups = group_rows(index, scores.size(0), "compute_rloo_vectorized_outcome_advantage");
  std::vector<int64_t> gid(scores.size(0));
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int64_t i : groups[g]) gid[i] = static_cast<int64_t>(g);
  }
  auto inv = torch::tensor(gid, torch::TensorOptions().dtype(torch::kLong)).to(scores.device());
  auto c = torch::bincount(inv).index_select(0, inv).to(scores.scalar_type());
  auto group_sum = torch::bincount(inv, scores).index_select(0, inv);
  auto adv = ((c * scores - group_sum) / (c - 1).clamp_min(1)) * (c > 1);
  adv = adv.unsqueeze(-1) * response_mask;
  return {adv, adv};
}

AdvantageOutput compute_reinforce_plus_plus_outcome_advantage(const at::Tensor& token_level_rewards,
                                                              const at::Tensor& response_mask, double gamma) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_reinforce_plus_plus_outcome_advantage");
  torch::NoGradGuard no_grad;
  auto returns = torch::zeros_like(token_level_rewards);
  auto running_return = torch::zeros_like(token_level_rewards.select(1, 0));
  for (int64_t t = token_level_rewards.size(1) - 1; t >= 0; --t) {
    running_return = token_level_rewards.select(1, t) + gamma * running_return;
    returns.select(1, t).copy_(running_return);
    running_return = running_return * response_mask.select(1, t);  // reset after EOS
  }
  auto advantages = masked_whiten(returns, response_mask) * response_mask;
  return {advantages, returns};
}

AdvantageOutput compute_reinforce_plus_plus_baseline_outcome_advantage(const at::Tensor& token_level_rewards,
                                                                       const at::Tensor& response_mask,
                                                                       const Index& index, double /*epsilon*/) {
  check_rewards_and_mask(token_level_rewards, response_mask,
                         "compute_reinforce_plus_plus_baseline_outcome_advantage");
  torch::NoGradGuard no_grad;
  const int64_t response_length = token_level_rewards.size(-1);
  auto scores = token_level_rewards.sum(-1);
  const auto groups = group_rows(index, scores.size(0), "compute_reinforce_plus_plus_baseline_outcome_advantage");
  for (const auto& rows : groups) {
    auto mean = rows.size() == 1 ? f32_scalar(0.0, scores) : gather_rows(scores, rows).mean();
    for (int64_t i : rows) {
      auto row = scores[i];
      row.copy_(row - mean);
    }
  }
  auto tiled = scores.unsqueeze(-1).repeat({1, response_length}) * response_mask;
  auto advantages = masked_whiten(tiled, response_mask) * response_mask;
  return {advantages, advantages};
}

AdvantageOutput compute_remax_outcome_advantage(const at::Tensor& token_level_rewards,
                                                const at::Tensor& reward_baselines, const at::Tensor& response_mask) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_remax_outcome_advantage");
  if (reward_baselines.dim() != 1 || reward_baselines.size(0) != token_level_rewards.size(0)) {
    throw ShapeError("compute_remax_outcome_advantage: reward_baselines must be (bs,) = (" +
                     std::to_string(token_level_rewards.size(0)) + "), got " + c10::str(reward_baselines.sizes()));
  }
  torch::NoGradGuard no_grad;
  auto returns = reverse_cumsum(token_level_rewards * response_mask);
  auto advantages = returns - reward_baselines.unsqueeze(-1) * response_mask;
  return {advantages, returns};
}

AdvantageOutput compute_opo_outcome_advantage(const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                                              const Index& index, double /*epsilon*/) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_opo_outcome_advantage");
  torch::NoGradGuard no_grad;
  auto response_length = response_mask.sum(-1);
  auto scores = token_level_rewards.sum(-1);
  const auto groups = group_rows(index, scores.size(0), "compute_opo_outcome_advantage");
  for (const auto& rows : groups) {
    at::Tensor baseline;
    if (rows.size() == 1) {
      baseline = f32_scalar(0.0, scores);
    } else {
      auto score_tensor = gather_rows(scores, rows);
      auto len_tensor = gather_rows(response_length, rows);
      baseline = (len_tensor * score_tensor).sum() / len_tensor.sum();
    }
    for (int64_t i : rows) {
      auto row = scores[i];
      row.copy_(row - baseline);
    }
  }
  auto advantages = scores.unsqueeze(-1) * response_mask;
  return {advantages, advantages};
}

AdvantageOutput compute_gpg_outcome_advantage(const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                                              const Index& index, double /*epsilon*/, double f_norm,
                                              double /*alpha*/) {
  check_rewards_and_mask(token_level_rewards, response_mask, "compute_gpg_outcome_advantage");
  torch::NoGradGuard no_grad;
  auto scores = token_level_rewards.sum(-1);
  const int64_t bsz = scores.size(0);
  // Python's `bsz / tensor` is tensor.reciprocal() * bsz: α is float32, as in verl.
  auto alpha = torch::count_nonzero(scores).clamp_min(1).reciprocal() * bsz;
  const auto groups = group_rows(index, bsz, "compute_gpg_outcome_advantage");
  std::vector<at::Tensor> mean(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    mean[g] = groups[g].size() == 1 ? f32_scalar(0.0, scores) : gather_rows(scores, groups[g]).mean();
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int64_t i : groups[g]) {
      auto row = scores[i];
      row.copy_(alpha * (row - mean[g]) / f_norm);
    }
  }
  auto advantages = scores.unsqueeze(-1) * response_mask;
  return {advantages, advantages};
}

}  // namespace hyflow::algos::core_algos
