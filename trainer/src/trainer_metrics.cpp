// verl's metric_utils (data, timing, throughput), seqlen balancing and the progress line.
#include "trainer_metrics.hpp"

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
  const auto lens = batch.batch.at("attention_mask").sum(-1);
  std::vector<double> work(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    const double s = lens[i].item<double>();
    work[static_cast<size_t>(i)] = 24576.0 * s + s * s;
  }
  // Greedy equal-size partition: heaviest rows first, each to the lightest open partition.
  std::vector<int64_t> order(static_cast<size_t>(B));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return work[a] > work[b]; });
  const int64_t per = B / world;
  std::vector<std::vector<int64_t>> parts(static_cast<size_t>(world));
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  for (int64_t i : order) {
    int64_t best = -1;
    for (int64_t p = 0; p < world; ++p)
      if (static_cast<int64_t>(parts[p].size()) < per && (best < 0 || load[p] < load[best])) best = p;
    parts[best].push_back(i);
    load[best] += work[i];
  }
  std::vector<int64_t> reorder;
  std::vector<double> seqlen(static_cast<size_t>(world), 0.0);
  for (int64_t p = 0; p < world; ++p) {
    std::sort(parts[p].begin(), parts[p].end());
    for (int64_t i : parts[p]) {
      reorder.push_back(i);
      seqlen[p] += lens[i].item<double>();
    }
  }
  double before_min = 1e300, before_max = 0;
  for (int64_t p = 0; p < world; ++p) {
    const double s = lens.narrow(0, p * per, per).sum().item<double>();
    before_min = std::min(before_min, s);
    before_max = std::max(before_max, s);
  }
  batch.reorder(reorder);
  m["global_seqlen/min"] = before_min;
  m["global_seqlen/max"] = before_max;
  m["global_seqlen/minmax_diff"] = before_max - before_min;
  m["global_seqlen/balanced_min"] = *std::min_element(seqlen.begin(), seqlen.end());
  m["global_seqlen/balanced_max"] = *std::max_element(seqlen.begin(), seqlen.end());
  m["global_seqlen/mean"] = lens.sum().item<double>() / static_cast<double>(world);
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
