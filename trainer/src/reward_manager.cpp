// naive / dapo / batch reward managers and the batch reward-function registry.
#include <hyflow/core/error.hpp>
#include <hyflow/core/named_registry.hpp>
#include <hyflow/trainer/reward_manager.hpp>

#include <torch/torch.h>

#include <iostream>

namespace hyflow::trainer {

namespace {
NamedRegistry<BatchComputeScoreFn>& batch_registry() {
  static NamedRegistry<BatchComputeScoreFn> registry("batch reward function");
  return registry;
}

const dataproto::Column& column(const DataProto& data, const char* name) {
  auto it = data.non_tensor_batch.find(name);
  if (it == data.non_tensor_batch.end())
    throw KeyError(std::string("reward manager: missing non-tensor column '") + name + "'");
  return it->second;
}

std::vector<int64_t> row_ids(const at::Tensor& row, int64_t begin, int64_t end) {
  std::vector<int64_t> out;
  auto a = row.accessor<int64_t, 1>();
  for (int64_t t = begin; t < end; ++t) out.push_back(a[t]);
  return out;
}

void strip_suffix(std::string& s, const std::string& suffix) {
  while (!suffix.empty() && s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0)
    s.erase(s.size() - suffix.size());
}
}  // namespace

void register_batch_compute_score(const std::string& name, BatchComputeScoreFn fn, bool overwrite) {
  batch_registry().put(name, std::move(fn), overwrite);
}

BatchComputeScoreFn get_batch_compute_score(const std::string& name) {
  return batch_registry().get(name);
}

RewardManager::RewardManager(std::shared_ptr<const tokenizers::Tokenizer> tokenizer, RewardManagerOptions options)
    : tokenizer_(std::move(tokenizer)), options_(std::move(options)) {
  if (options_.name != "naive" && options_.name != "dapo" && options_.name != "batch")
    throw ValueError("config key 'reward_model.reward_manager': unknown manager '" + options_.name +
                     "' (naive, dapo, batch)");
  if (options_.name == "batch") (void)get_batch_compute_score(options_.compute_score);
  else (void)algos::reward_score::get_compute_score(options_.compute_score);
  if (options_.overlong_buffer.enable && options_.overlong_buffer.len <= 0)
    throw ValueError("config key 'reward_model.overlong_buffer.len' must be > 0 when the buffer is enabled");
}

RewardOutput RewardManager::operator()(const DataProto& data) const {
  RewardOutput out;
  const at::Tensor responses = data.batch.at("responses");
  if (data.batch.contains("rm_scores")) {
    out.reward_tensor = data.batch.at("rm_scores").to(at::kFloat);
    return out;
  }
  const at::Tensor prompts = data.batch.at("prompts");
  const at::Tensor mask = data.batch.at("attention_mask");
  const int64_t B = responses.size(0), P = prompts.size(1), T = responses.size(1);
  const auto valid_prompt = mask.narrow(1, 0, P).sum(-1);
  const auto valid_resp = mask.narrow(1, P, T).sum(-1);
  // Agent rollouts (agents::agent_outputs_to_batch) score the model's last turn: the ids after
  // the last tool or user turn (response_mask 0), not the tool's output.
  at::Tensor turn_mask;
  if (data.non_tensor_batch.find("__num_turns__") != data.non_tensor_batch.end() &&
      data.batch.contains("response_mask"))
    turn_mask = data.batch.at("response_mask").to(torch::kLong).contiguous();
  const dataproto::Column& sources = column(data, "data_source");
  const dataproto::Column& rms = column(data, "reward_model");
  auto extra_it = data.non_tensor_batch.find("extra_info");
  auto turns_it = data.non_tensor_batch.find("__num_turns__");
  auto scores_it = data.non_tensor_batch.find("reward_scores");  // tool calc_reward and interaction scores

  std::vector<std::string> solution_strs, data_sources;
  std::vector<nlohmann::json> ground_truths, extra_infos;
  std::vector<int64_t> resp_lens;
  const bool skip_special = options_.name != "dapo";
  const std::string eos_text = tokenizer_->decode({tokenizer_->eos_token_id()});
  for (int64_t r = 0; r < B; ++r) {
    const int64_t vr = valid_resp[r].item<int64_t>();
    int64_t last_turn = 0;
    if (turn_mask.defined()) {
      const at::Tensor row = turn_mask[r];
      auto m = row.accessor<int64_t, 1>();
      for (int64_t t = vr; t > 0; --t)
        if (m[t - 1] == 0) {
          last_turn = t;
          break;
        }
    }
    std::string solution = tokenizer_->decode(row_ids(responses[r].contiguous(), last_turn, vr), skip_special);
    if (!skip_special) strip_suffix(solution, eos_text);
    solution_strs.push_back(std::move(solution));
    const auto& src = sources.at(static_cast<size_t>(r));
    data_sources.push_back(src.is_string() ? src.get<std::string>() : src.dump());
    const auto& rm = rms.at(static_cast<size_t>(r));
    ground_truths.push_back(rm.is_object() && rm.contains("ground_truth") ? rm.at("ground_truth") : nlohmann::json());
    nlohmann::json extra = extra_it != data.non_tensor_batch.end() ? extra_it->second.at(static_cast<size_t>(r))
                                                                   : nlohmann::json::object();
    if (extra.is_null()) extra = nlohmann::json::object();
    if (extra.is_object()) {  // verl's reward managers: the rollout's own scores for the reward function
      extra["num_turns"] = turns_it != data.non_tensor_batch.end() ? turns_it->second.at(static_cast<size_t>(r))
                                                                   : nlohmann::json();
      extra["rollout_reward_scores"] = scores_it != data.non_tensor_batch.end()
                                           ? scores_it->second.at(static_cast<size_t>(r))
                                           : nlohmann::json::object();
    }
    extra_infos.push_back(std::move(extra));
    resp_lens.push_back(vr);
  }

  std::vector<algos::reward_score::ScoreResult> results;
  if (options_.name == "batch") {
    results = get_batch_compute_score(options_.compute_score)(data_sources, solution_strs, ground_truths, extra_infos);
    if (static_cast<int64_t>(results.size()) != B)
      throw ShapeError("batch reward function '" + options_.compute_score + "' returned " +
                       std::to_string(results.size()) + " results for " + std::to_string(B) + " rows");
  } else {
    const auto fn = algos::reward_score::get_compute_score(options_.compute_score);
    for (int64_t r = 0; r < B; ++r)
      results.push_back(fn(data_sources[r], solution_strs[r], ground_truths[r], extra_infos[r]));
  }

  out.reward_tensor = torch::zeros({B, T}, torch::kFloat);
  std::map<std::string, int64_t> examined;
  for (int64_t r = 0; r < B; ++r) {
    double reward = results[r].score;
    for (const auto& [k, v] : results[r].extra_info.items()) out.reward_extra_info[k].push_back(v);
    if (options_.name == "dapo") {
      if (results[r].extra_info.empty()) out.reward_extra_info["acc"].push_back(results[r].score);
      if (options_.overlong_buffer.enable) {
        const double expected = static_cast<double>(options_.max_response_length - options_.overlong_buffer.len);
        const double exceed = static_cast<double>(resp_lens[r]) - expected;
        const double penalty = std::min(
            -exceed / static_cast<double>(options_.overlong_buffer.len) * options_.overlong_buffer.penalty_factor, 0.0);
        reward += penalty;
        out.reward_extra_info["overlong_reward"].push_back(penalty);
        out.reward_extra_info["overlong"].push_back(penalty < 0);
      }
    }
    // verl indexes valid_response_length - 1, i.e. the last column for an empty response
    out.reward_tensor[r][resp_lens[r] > 0 ? resp_lens[r] - 1 : T - 1] = reward;
    if (examined[data_sources[r]]++ < options_.num_examine) {
      const int64_t vp = valid_prompt[r].item<int64_t>();
      std::cout << "[prompt] " << tokenizer_->decode(row_ids(prompts[r].contiguous(), P - vp, P), true)
                << "\n[response] " << solution_strs[r] << "\n[ground_truth] " << ground_truths[r].dump() << "\n[score] "
                << reward << "\n";
    }
  }
  return out;
}

}  // namespace hyflow::trainer
