// Sequence balancing of a batch over the data-parallel ranks, the rollout handoff metrics and the
// progress line.
#include "trainer_metrics.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/parallel/seqlen_balancing.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <iomanip>
#include <numeric>
#include <sstream>

namespace hyflow::trainer {

nlohmann::json rollout_probs_diff_metrics(const DataProto& batch) {
  const auto& rollout = batch.batch.at("rollout_log_probs");
  const auto& actor = batch.batch.at("old_log_probs");
  if (rollout.sizes() != actor.sizes())
    throw ShapeError("rollout_probs_diff: rollout_log_probs " + c10::str(rollout.sizes()) + " vs old_log_probs " +
                     c10::str(actor.sizes()));
  const int64_t R = batch.batch.at("responses").size(1);
  // the model's own tokens (verl's response_mask): tool and user turns of agent loops have no rollout log-prob
  const auto mask = (batch.batch.contains("response_mask") ? batch.batch.at("response_mask")
                                                           : batch.batch.at("attention_mask").narrow(1, -R, R))
                        .to(torch::kBool);
  const auto diff = torch::abs(torch::exp(rollout) - torch::exp(actor)).masked_select(mask);
  nlohmann::json m = nlohmann::json::object();
  if (diff.numel() == 0) return m;
  m["training/rollout_probs_diff_max"] = diff.max().item<double>();
  m["training/rollout_probs_diff_mean"] = diff.mean().item<double>();
  m["training/rollout_probs_diff_std"] = diff.std().item<double>();
  return m;
}

void record_rollout_handoff(const nlohmann::json& meta, nlohmann::json& m) {
  if (meta.contains("timing") && meta.at("timing").contains("reshard")) {
    auto& slot = m["timing_s/reshard"];
    const double s = meta.at("timing").at("reshard").get<double>();
    slot = slot.is_number() ? slot.get<double>() + s : s;
  }
  if (meta.contains("reshard_peak_extra_bytes")) {
    auto& slot = m["perf/reshard_peak_extra_bytes"];
    const int64_t bytes = meta.at("reshard_peak_extra_bytes").get<int64_t>();
    slot = slot.is_number() ? std::max(slot.get<int64_t>(), bytes) : bytes;
  }
}

void balance_batch(DataProto& batch, int64_t world, nlohmann::json& m) {
  const int64_t B = batch.size();
  if (world <= 1 || B % world != 0) return;
  auto lens_t = batch.batch.at("attention_mask").reshape({B, -1}).sum(-1).to(torch::kLong).contiguous();
  const std::vector<int64_t> lens(lens_t.data_ptr<int64_t>(), lens_t.data_ptr<int64_t>() + B);
  const auto workloads = parallel::seqlen_balancing::calculate_workload(lens);
  const auto partitions = parallel::seqlen_balancing::balance_batch_partitions(workloads, world);
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(B));
  for (const auto& p : partitions) order.insert(order.end(), p.begin(), p.end());
  batch.reorder(order);
  // verl logs these in workload units (24576·s + s²), not tokens
  for (const auto& [key, value] :
       parallel::seqlen_balancing::log_seqlen_unbalance(workloads, partitions, "global_seqlen"))
    m[key] = value;
}


}  // namespace hyflow::trainer
