// verl's metric_utils (data, timing, throughput), seqlen balancing and the progress line.
#include "trainer_metrics.hpp"

#include <hyflow/parallel/seqlen_balancing.hpp>

#include <algorithm>
#include <iomanip>
#include <numeric>
#include <sstream>

namespace hyflow::trainer {

namespace {
void stats(nlohmann::json& m, const std::string& name, const at::Tensor& values) {
  if (values.numel() == 0) return;
  auto v = values.to(at::kDouble);
  m[name + "/mean"] = v.mean().item<double>();
  m[name + "/max"] = v.max().item<double>();
  m[name + "/min"] = v.min().item<double>();
}
}  // namespace

void add_data_metrics(const DataProto& batch, bool use_critic, nlohmann::json& m) {
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

void add_timing_and_throughput_metrics(const DataProto& batch, int64_t world, nlohmann::json& m) {
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

void balance_batch(DataProto& batch, int64_t world, nlohmann::json& m) {
  const int64_t B = batch.size();
  if (world <= 1 || B % world != 0) return;
  auto lens_t = batch.batch.at("attention_mask").reshape({B, -1}).sum(-1).to(torch::kLong).contiguous();
  const std::vector<int64_t> lens(lens_t.data_ptr<int64_t>(), lens_t.data_ptr<int64_t>() + B);
  const auto workloads = seqlen_balancing::calculate_workload(lens);
  const auto partitions = seqlen_balancing::balance_batch_partitions(workloads, world);
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(B));
  for (const auto& p : partitions) order.insert(order.end(), p.begin(), p.end());
  batch.reorder(order);
  // verl logs these in workload units (24576·s + s²), not tokens
  for (const auto& [key, value] : seqlen_balancing::log_seqlen_unbalance(workloads, partitions, "global_seqlen"))
    m[key] = value;
}

std::string format_progress(const nlohmann::json& m, int64_t step, int64_t total) {
  std::ostringstream os;
  constexpr int kWidth = 20;
  const int filled = total > 0 ? static_cast<int>(kWidth * step / total) : 0;
  os << "step " << step << "/" << total << " [" << std::string(static_cast<size_t>(filled), '=')
     << std::string(static_cast<size_t>(kWidth - filled), ' ') << "]" << std::fixed << std::setprecision(3);
  if (m.contains("critic/score/mean")) os << " score " << m["critic/score/mean"].get<double>();
  for (const auto& [k, v] : m.items())
    if (k.rfind("val-core/", 0) == 0) os << " " << k << " " << v.get<double>();
  if (m.contains("actor/pg_loss")) os << " pg_loss " << m["actor/pg_loss"].get<double>();
  if (m.contains("timing_s/step")) os << " | " << std::setprecision(2) << m["timing_s/step"].get<double>() << " s/step";
  return os.str();
}

}  // namespace hyflow::trainer
