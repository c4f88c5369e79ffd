// verl's compute_data_metrics, compute_timing_metrics, compute_throughout_metrics
// (trainer/ppo/metric_utils.py) and reduce_metrics (utils/metric/utils.py).
#include <hyflow/algos/metric_utils.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/data_proto.hpp>

#include "numpy_sum.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace hyflow::algos::metric_utils {

namespace {

// mean/max/min in the tensor's own dtype (verl calls torch.mean/max/min, then .item()).
void stats(nlohmann::json& m, const std::string& name, const at::Tensor& values) {
  if (values.numel() == 0)
    throw ValueError("compute_data_metrics: '" + name +
                     "' has no values (an empty selection; verl's torch.max raises)");
  m[name + "/mean"] = values.mean().item<double>();
  m[name + "/max"] = values.max().item<double>();
  m[name + "/min"] = values.min().item<double>();
}

// verl's _compute_response_info: per-row prompt and response lengths as float32.
struct ResponseInfo {
  at::Tensor prompt_length, response_length;
  int64_t max_prompt_length, max_response_length;
};

ResponseInfo response_info(const DataProto& batch) {
  const int64_t T = batch.batch.at("responses").size(-1);
  const auto& attn = batch.batch.at("attention_mask");
  if (attn.dim() != 2 || attn.size(1) < T)
    throw ShapeError("metric_utils: attention_mask " + c10::str(attn.sizes()) + " must be (bs, prompt + " +
                     std::to_string(T) + " response positions)");
  const int64_t P = attn.size(1) - T;
  return {attn.narrow(1, 0, P).sum(-1).to(at::kFloat), attn.narrow(1, P, T).sum(-1).to(at::kFloat), P, T};
}

double clip_ratio(const at::Tensor& lengths, int64_t max_length) {
  return torch::eq(lengths, static_cast<double>(max_length)).to(at::kFloat).mean().item<double>();
}

// min/max keep integers as integers (numpy on an int array), mean is a float.
void column_stats(nlohmann::json& m, const std::string& name, const dataproto::Column& column) {
  if (column.empty()) throw ValueError("compute_data_metrics: non-tensor column '" + name + "' is empty");
  bool all_int = true;
  std::vector<double> values;
  for (const auto& v : column) {
    if (!v.is_number())
      throw ValueError("compute_data_metrics: non-tensor column '" + name + "' holds a non-number: " + v.dump());
    all_int = all_int && v.is_number_integer();
    values.push_back(v.get<double>());
  }
  auto less = [](const nlohmann::json& a, const nlohmann::json& b) { return a.get<double>() < b.get<double>(); };
  const auto [lo, hi] = std::minmax_element(column.begin(), column.end(), less);
  m[name + "/min"] = all_int ? nlohmann::json(lo->get<int64_t>()) : nlohmann::json(lo->get<double>());
  m[name + "/max"] = all_int ? nlohmann::json(hi->get<int64_t>()) : nlohmann::json(hi->get<double>());
  m[name + "/mean"] = detail::numpy_mean(values);
}

double timing(const std::map<std::string, double>& timing_raw, const std::string& name) {
  auto it = timing_raw.find(name);
  if (it == timing_raw.end()) throw KeyError("compute_throughout_metrics: timing_raw has no '" + name + "'");
  return it->second;
}

}  // namespace

nlohmann::json compute_data_metrics(const DataProto& batch, bool use_critic) {
  nlohmann::json m = nlohmann::json::object();
  const auto sequence_score = batch.batch.at("token_level_scores").sum(-1);
  const auto sequence_reward = batch.batch.at("token_level_rewards").sum(-1);
  const auto response_mask = batch.batch.at("response_mask").to(at::kBool);
  const auto info = response_info(batch);

  // Aborted rows (no response token) stay out of the score and reward statistics.
  const auto aborted = info.response_length.eq(0);
  const auto non_aborted = aborted.logical_not();
  const auto non_aborted_length = info.response_length.masked_select(non_aborted);
  if (non_aborted_length.numel() == 0)
    throw ValueError("compute_data_metrics: all " + std::to_string(info.response_length.numel()) +
                     " samples are aborted (zero-length responses)");
  stats(m, "critic/score", sequence_score.masked_select(non_aborted));
  stats(m, "critic/rewards", sequence_reward.masked_select(non_aborted));

  const auto valid_returns = batch.batch.at("returns").masked_select(response_mask);
  stats(m, "critic/advantages", batch.batch.at("advantages").masked_select(response_mask));
  stats(m, "critic/returns", valid_returns);
  if (use_critic) {
    const auto valid_values = batch.batch.at("values").masked_select(response_mask);
    stats(m, "critic/values", valid_values);
    const auto return_diff_var = torch::var(valid_returns - valid_values);
    const auto return_var = torch::var(valid_returns);
    m["critic/vf_explained_var"] = (1.0 - return_diff_var / (return_var + 1e-5)).item<double>();
  }

  stats(m, "response_length", info.response_length);
  m["response_length/clip_ratio"] = clip_ratio(info.response_length, info.max_response_length);
  stats(m, "response_length_non_aborted", non_aborted_length);
  m["response_length_non_aborted/clip_ratio"] = clip_ratio(non_aborted_length, info.max_response_length);
  m["response/aborted_ratio"] = aborted.to(at::kFloat).mean().item<double>();
  stats(m, "prompt_length", info.prompt_length);
  m["prompt_length/clip_ratio"] = clip_ratio(info.prompt_length, info.max_prompt_length);

  if (batch.non_tensor_batch.contains("__num_turns__"))
    column_stats(m, "num_turns", batch.non_tensor_batch.at("__num_turns__"));
  if (batch.non_tensor_batch.contains("tool_call_counts"))
    column_stats(m, "tool_call_counts", batch.non_tensor_batch.at("tool_call_counts"));
  return m;
}

nlohmann::json compute_timing_metrics(const DataProto& batch, const std::map<std::string, double>& timing_raw) {
  const auto info = response_info(batch);
  const double num_prompt_tokens = info.prompt_length.sum().item<double>();
  const double num_response_tokens = info.response_length.sum().item<double>();
  const double num_overall_tokens = num_prompt_tokens + num_response_tokens;
  nlohmann::json m = nlohmann::json::object();
  for (const auto& [name, seconds] : timing_raw) m["timing_s/" + name] = seconds;
  for (const char* name : {"gen", "ref", "values", "adv", "update_critic", "update_actor"}) {
    auto it = timing_raw.find(name);
    if (it == timing_raw.end()) continue;
    const double tokens = std::string(name) == "gen" ? num_response_tokens : num_overall_tokens;
    if (tokens == 0)
      throw ValueError(std::string("compute_timing_metrics: section '") + name + "' has no tokens to divide by");
    m[std::string("timing_per_token_ms/") + name] = it->second * 1000 / tokens;
  }
  return m;
}

nlohmann::json compute_throughout_metrics(const DataProto& batch, const std::map<std::string, double>& timing_raw,
                                          int64_t n_gpus) {
  if (!batch.meta_info.contains("global_token_num"))
    throw KeyError("compute_throughout_metrics: meta_info has no 'global_token_num'");
  int64_t total_num_tokens = 0;
  for (const auto& n : batch.meta_info.at("global_token_num")) total_num_tokens += n.get<int64_t>();
  const double time = timing(timing_raw, "step");
  return {{"perf/total_num_tokens", total_num_tokens},
          {"perf/time_per_step", time},
          {"perf/throughput", static_cast<double>(total_num_tokens) / (time * static_cast<double>(n_gpus))}};
}

std::map<std::string, double> reduce_metrics(const nlohmann::json& metrics) {
  if (!metrics.is_object())
    throw ValueError("reduce_metrics: expected an object of metric lists, got " + metrics.dump());
  std::map<std::string, double> out;
  for (const auto& [name, values] : metrics.items()) {
    std::vector<double> flat;
    std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& v) {
      if (v.is_array())
        for (const auto& e : v) walk(e);
      else if (v.is_number())
        flat.push_back(v.get<double>());
      else if (v.is_boolean())
        flat.push_back(v.get<bool>() ? 1.0 : 0.0);
      else
        throw ValueError("reduce_metrics: metric '" + name + "' holds a non-number: " + v.dump());
    };
    walk(values);
    const bool is_max = name.find("max") != std::string::npos;
    const bool is_min = !is_max && name.find("min") != std::string::npos;
    if (flat.empty() && (is_max || is_min))
      throw ValueError("reduce_metrics: metric '" + name + "' has no values to take the " + (is_max ? "max" : "min") +
                       " of");
    if (is_max) {
      out[name] = *std::max_element(flat.begin(), flat.end());
    } else if (is_min) {
      out[name] = *std::min_element(flat.begin(), flat.end());
    } else if (flat.empty()) {
      out[name] = std::numeric_limits<double>::quiet_NaN();
    } else {
      out[name] = detail::numpy_mean(flat);
    }
  }
  return out;
}

}  // namespace hyflow::algos::metric_utils
