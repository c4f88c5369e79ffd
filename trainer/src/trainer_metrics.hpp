#pragma once
// Trainer-internal helpers: sequence balancing and the progress line.

#include <hyflow/dataproto/data_proto.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace hyflow::trainer {

/// Reorders rows so each of `world` equal-size contiguous chunks carries about the same
/// attention workload (24576·s + s², s = valid tokens); logs global_seqlen/*.
void balance_batch(DataProto& batch, int64_t world, nlohmann::json& metrics);
/// verl's training/rollout_probs_diff_{max,mean,std}: |exp(rollout_log_probs) - exp(old_log_probs)|
/// over the response tokens (attention_mask's last R columns); std is the unbiased one (torch.std).
/// Empty when the batch has no response token.
nlohmann::json rollout_probs_diff_metrics(const DataProto& batch);
/// The colocated rollout's weight handoff, from generate_sequences' meta_info: timing["reshard"]
/// (verl's sharding manager timing) added to timing_s/reshard, reshard_peak_extra_bytes as the
/// largest perf/reshard_peak_extra_bytes of the step.
void record_rollout_handoff(const nlohmann::json& gen_meta_info, nlohmann::json& metrics);
/// "step 3/40 [====      ] score 0.41 acc 0.38 | 2.1 s/step".
std::string format_progress(const nlohmann::json& metrics, int64_t step, int64_t total);

}  // namespace hyflow::trainer
