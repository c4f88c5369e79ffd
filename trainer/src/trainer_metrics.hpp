#pragma once
// Trainer-internal helpers: phase timing, sequence balancing and rollout metrics.

#include <hyflow/actors/call_trace.hpp>
#include <hyflow/dataproto/data_proto.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

namespace hyflow::trainer {

/// Adds the seconds of its scope to metrics["timing_s/<name>"] (verl's marked_timer): a step of
/// several generation batches sums their times. The scope is also a "phase" span of the step
/// timeline when one records (docs/profiling.md).
class Timer {
 public:
  Timer(nlohmann::json& metrics, std::string name)
      : span_("phase", name), metrics_(metrics), name_(std::move(name)), start_(std::chrono::steady_clock::now()) {}
  ~Timer() {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    auto& slot = metrics_["timing_s/" + name_];
    slot = slot.is_number() ? slot.get<double>() + s : s;
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  actors::TraceSpan span_;  // first: it opens before the clock starts and closes after it stops
  nlohmann::json& metrics_;
  std::string name_;
  std::chrono::steady_clock::time_point start_;
};

/// Reorders rows so each of `world` equal-size contiguous chunks carries about the same
/// attention workload (24576·s + s², s = valid tokens); logs global_seqlen/*.
void balance_batch(DataProto& batch, int64_t world, nlohmann::json& metrics);
/// verl's training/rollout_probs_diff_{max,mean,std}: |exp(rollout_log_probs) - exp(old_log_probs)|
/// over the model's response tokens (response_mask; without one, attention_mask's last R columns); std is the
/// unbiased one (torch.std).
/// Empty when the batch has no response token.
nlohmann::json rollout_probs_diff_metrics(const DataProto& batch);
/// The colocated rollout's weight handoff, from generate_sequences' meta_info: timing["reshard"]
/// (verl's sharding manager timing) added to timing_s/reshard, reshard_peak_extra_bytes as the
/// largest perf/reshard_peak_extra_bytes of the step.
void record_rollout_handoff(const nlohmann::json& gen_meta_info, nlohmann::json& metrics);

}  // namespace hyflow::trainer
