// PF-PPO resampling (verl core_algos.compute_pf_ppo_reweight_data).
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include <torch/torch.h>

#include <string>
#include <vector>

namespace hyflow::algos::core_algos {
namespace {

at::Tensor pf_ppo_weights(const at::Tensor& scores, const std::string& method, double weight_pow) {
  if (method == "pow") return torch::pow(torch::abs(scores), weight_pow);
  if (method == "max_min") {
    auto extreme = torch::logical_or(scores == scores.max(), scores == scores.min());
    return torch::where(extreme, 1.0, 0.0).to(torch::kFloat);
  }
  if (method == "max_random") return torch::where(scores == scores.max(), 0.4, 0.1).to(torch::kFloat);
  throw ValueError("compute_pf_ppo_reweight_data: unsupported reweight_method '" + method +
                   "' (pow, max_min, max_random)");
}

}  // namespace

DataProto compute_pf_ppo_reweight_data(const DataProto& data, const std::string& reweight_method,
                                       double weight_pow) {
  at::Tensor sample_indices;
  {
    torch::NoGradGuard no_grad;
    auto scores = data.batch.at("token_level_scores").sum(-1);
    auto weights = torch::clamp_min(pf_ppo_weights(scores, reweight_method, weight_pow) + 1e-8, 1e-8);
    const int64_t batch_size = scores.size(0);
    sample_indices = torch::multinomial(weights, batch_size, /*replacement=*/true).cpu();
  }
  DataProto out = data.select_idxs(sample_indices);
  // Per-row lists in meta_info follow the rows; everything else is kept.
  const auto n = static_cast<size_t>(data.size());
  const auto* idx = sample_indices.data_ptr<int64_t>();
  for (auto& [key, value] : out.meta_info.items()) {
    if (!value.is_array() || value.size() != n) continue;
    Json resampled = Json::array();
    for (size_t i = 0; i < n; ++i) resampled.push_back(data.meta_info[key][static_cast<size_t>(idx[i])]);
    value = std::move(resampled);
  }
  return out;
}

}  // namespace hyflow::algos::core_algos
