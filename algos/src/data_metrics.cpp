// verl's compute_data_metrics, compute_timing_metrics + compute_throughout_metrics and
// reduce_metrics (trainer/ppo/metric_utils.py, utils/metric/utils.py).
#include <hyflow/algos/metric_utils.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/data_proto.hpp>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace hyflow::algos::metric_utils {

namespace {
void stats(nlohmann::json& m, const std::string& name, const at::Tensor& values) {
  if (values.numel() == 0) return;
  auto v = values.to(at::kDouble);
  m[name + "/mean"] = v.mean().item<double>();
  m[name + "/max"] = v.max().item<double>();
  m[name + "/min"] = v.min().item<double>();
}
}  // namespace

void compute_data_metrics(const DataProto& batch, bool use_critic, nlohmann::json& m) {
  const auto& responses = batch.batch.at("responses");
  const int64_t T = responses.size(1);
  const auto& attn = batch.batch.at("attention_mask");
  const int64_t P = attn.size(1) - T;
  const auto mask = batch.batch.at("response_mask").to(at::kBool);
  stats(m, "critic/score", batch.batch.at("token_level_scores").sum(-1));
  stats(m, "critic/rewards", batch.batch.at("token_level_rewards").sum(-1));
  stats(m, "critic/advantages", batch.batch.at("advantages").masked_select(mask));
  stats(m, "critic/returns", batch.batch.at("returns").masked_select(mask));
  if (use_critic && batch.batch.contains("values")) {
    const auto values = batch.batch.at("values").masked_select(mask).to(at::kDouble);
    const auto returns = batch.batch.at("returns").masked_select(mask).to(at::kDouble);
    stats(m, "critic/values", values);
    m["critic/vf_explained_var"] = (1.0 - (returns - values).var() / (returns.var() + 1e-5)).item<double>();
  }
  const auto resp_len = attn.narrow(1, P, T).sum(-1).to(at::kDouble);
  stats(m, "response_length", resp_len);
  m["response_length/clip_ratio"] = resp_len.eq(static_cast<double>(T)).to(at::kDouble).mean().item<double>();
  const auto prompt_len = attn.narrow(1, 0, P).sum(-1).to(at::kDouble);
  stats(m, "prompt_length", prompt_len);
  m["prompt_length/clip_ratio"] = prompt_len.eq(static_cast<double>(P)).to(at::kDouble).mean().item<double>();
}

void compute_timing_and_throughput_metrics(const DataProto& batch, int64_t world, nlohmann::json& m) {
  const int64_t T = batch.batch.at("responses").size(1);
  const double total_tokens = batch.batch.at("attention_mask").sum().item<double>();
  const double response_tokens = batch.batch.at("attention_mask").narrow(1, -T, T).sum().item<double>();
  for (const char* name : {"gen", "ref", "values", "adv", "update_critic", "update_actor"}) {
    const std::string key = std::string("timing_s/") + name;
    if (!m.contains(key)) continue;
    const double tokens = std::string(name) == "gen" ? response_tokens : total_tokens;
    m[std::string("timing_per_token_ms/") + name] = m[key].get<double>() * 1000.0 / std::max(tokens, 1.0);
  }
  const double step_s = m.at("timing_s/step").get<double>();
  m["perf/total_num_tokens"] = total_tokens;
  m["perf/time_per_step"] = step_s;
  m["perf/throughput"] = total_tokens / (step_s * static_cast<double>(world));
}

double reduce_metric(const std::string& name, const nlohmann::json& values) {
  std::vector<double> flat;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& v) {
    if (v.is_array())
      for (const auto& e : v) walk(e);
    else if (v.is_number()) flat.push_back(v.get<double>());
    else throw ValueError("metric '" + name + "' holds a non-number: " + v.dump());
  };
  walk(values);
  if (flat.empty()) throw ValueError("metric '" + name + "' has no values");
  if (name.find("max") != std::string::npos) return *std::max_element(flat.begin(), flat.end());
  if (name.find("min") != std::string::npos) return *std::min_element(flat.begin(), flat.end());
  double sum = 0;
  for (double v : flat) sum += v;
  return sum / static_cast<double>(flat.size());
}

}  // namespace hyflow::algos::metric_utils
