// DAPO dynamic sampling (algorithm.filter_groups): the metric per row, the groups kept, and the
// sampler that fills a step's batch from several generation batches (docs/trainer.md).
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/dynamic_sampling.hpp>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::trainer {

std::vector<double> filter_metric_values(const DataProto& batch, const std::string& metric) {
  const std::string key = "config key 'algorithm.filter_groups.metric'";
  std::string tensor;
  if (metric == "seq_reward") tensor = "token_level_scores";
  if (metric == "seq_final_reward")
    tensor = batch.batch.contains("token_level_rewards") ? "token_level_rewards" : "token_level_scores";
  std::vector<double> out;
  if (!tensor.empty()) {
    if (!batch.batch.contains(tensor))
      throw KeyError(key + " = '" + metric + "' needs the batch's " + tensor + ", which it lacks");
    const at::Tensor sums = batch.batch.at(tensor).sum(-1).to(at::kDouble).contiguous();
    out.assign(sums.data_ptr<double>(), sums.data_ptr<double>() + sums.numel());
    return out;
  }
  auto it = batch.non_tensor_batch.find(metric);
  if (it == batch.non_tensor_batch.end()) {
    std::string have;
    for (const auto& [name, column] : batch.non_tensor_batch) have += (have.empty() ? "" : ", ") + name;
    throw KeyError(key + ": the scored batch has no column '" + metric +
                   "' (seq_reward, seq_final_reward or a reward_extra_info column; columns: " + have + ")");
  }
  for (size_t row = 0; row < it->second.size(); ++row) {
    const auto& v = it->second[row];
    if (v.is_boolean()) out.push_back(v.get<bool>() ? 1.0 : 0.0);
    else if (v.is_number()) out.push_back(v.get<double>());
    else
      throw ValueError(key + ": column '" + metric + "' row " + std::to_string(row) + " is not a number: " + v.dump());
  }
  return out;
}

std::vector<int64_t> kept_group_rows(const std::vector<std::string>& uids, const std::vector<double>& values) {
  if (uids.size() != values.size())
    throw ShapeError("filter_groups: " + std::to_string(uids.size()) + " uids for " + std::to_string(values.size()) +
                     " metric values");
  std::map<std::string, std::pair<size_t, bool>> groups;  // uid -> (rows, all values equal)
  std::map<std::string, double> first;
  for (size_t i = 0; i < uids.size(); ++i) {
    auto [it, fresh] = groups.try_emplace(uids[i], 0, true);
    if (fresh) first[uids[i]] = values[i];
    else if (values[i] != first[uids[i]]) it->second.second = false;
    ++it->second.first;
  }
  std::vector<int64_t> rows;
  for (size_t i = 0; i < uids.size(); ++i) {
    const auto& [count, all_equal] = groups.at(uids[i]);
    if (count == 1 || !all_equal) rows.push_back(static_cast<int64_t>(i));
  }
  return rows;
}

DynamicSampler::DynamicSampler(int64_t train_batch_size, int64_t n, int64_t max_num_gen_batches)
    : train_batch_size_(train_batch_size), n_(n), max_num_gen_batches_(max_num_gen_batches) {
  if (train_batch_size <= 0 || n <= 0)
    throw ValueError("DynamicSampler: train_batch_size " + std::to_string(train_batch_size) + " and n " +
                     std::to_string(n) + " must be > 0");
}

int64_t DynamicSampler::add(const DataProto& scored, const std::vector<double>& metric_values) {
  auto it = scored.non_tensor_batch.find("uid");
  if (it == scored.non_tensor_batch.end()) throw KeyError("filter_groups: the scored batch has no 'uid' column");
  std::vector<std::string> uids;
  for (const auto& u : it->second) uids.push_back(u.is_string() ? u.get<std::string>() : u.dump());
  const std::vector<int64_t> rows = kept_group_rows(uids, metric_values);
  std::set<std::string> kept_uids;
  for (int64_t r : rows) kept_uids.insert(uids[static_cast<size_t>(r)]);
  ++num_gen_batches_;
  num_prompts_ += static_cast<int64_t>(kept_uids.size());
  if (!rows.empty()) kept_.push_back(scored.select_idxs(rows));
  if (!full() && max_num_gen_batches_ > 0 && num_gen_batches_ >= max_num_gen_batches_)
    throw ValueError("config key 'algorithm.filter_groups.max_num_gen_batches' = " +
                     std::to_string(max_num_gen_batches_) + ": after " + std::to_string(num_gen_batches_) +
                     " generation batches only " + std::to_string(num_prompts_) + " of data.train_batch_size = " +
                     std::to_string(train_batch_size_) +
                     " prompts have rewards that differ within their group; the data may be too hard or too easy "
                     "(0 allows unlimited generation batches)");
  return static_cast<int64_t>(kept_uids.size());
}

DataProto DynamicSampler::take() {
  if (!full())
    throw Error("DynamicSampler::take: " + std::to_string(num_prompts_) + " of " + std::to_string(train_batch_size_) +
                " prompts kept");
  DataProto all = kept_.size() == 1 ? kept_.front() : DataProto::concat(kept_);
  kept_.clear();
  num_gen_batches_ = 0;
  num_prompts_ = 0;
  return all.slice(0, train_batch_size_ * n_);
}

}  // namespace hyflow::trainer
