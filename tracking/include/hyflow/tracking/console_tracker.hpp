#pragma once
// The "console" tracker: one progress line per step on a stream (stdout by default).

#include <hyflow/tracking/run_info.hpp>
#include <hyflow/tracking/tracker.hpp>

#include <iostream>
#include <string>

namespace hyflow::tracking {

/// "step 3/40 [=                   ] score 0.410 pg_loss 0.012 | 2.10 s/step": a 20-wide bar, then
/// whichever the metrics hold of critic/score/mean ("score"), val-core/* (by name),
/// actor/pg_loss ("pg_loss"), train/loss ("loss"), val/loss (by name) and timing_s/step.
std::string format_progress(const nlohmann::json& metrics, int64_t step, int64_t total);

class ConsoleTracker : public Tracker {
 public:
  explicit ConsoleTracker(const RunInfo& run, std::ostream& out = std::cout);
  /// Prints nothing: the config is long, and the jsonl tracker keeps it.
  void log_config(const nlohmann::json& config) override;
  /// format_progress of the step against RunInfo::total_steps.
  void log(const nlohmann::json& metrics, int64_t step) override;
  void flush() override;
  void close() override;

 private:
  std::ostream& out_;
  int64_t total_steps_;
};

}  // namespace hyflow::tracking
