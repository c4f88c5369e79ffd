#pragma once
// The "console" tracker: a progress line per step on a stream (stdout by default), every step on
// a terminal and every trainer.console_every-th step (default 10) into a pipe or file.

#include <hyflow/tracking/run_info.hpp>
#include <hyflow/tracking/tracker.hpp>

#include <deque>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

namespace hyflow::tracking {

/// What the progress line shows besides the step's own metrics.
struct ProgressExtras {
  /// Seconds the run still needs (the remaining steps at the recent mean s/step); unset: unknown.
  std::optional<double> eta_s;
  /// The val-core/* (and val/loss) metrics of the last validation before this step, and its step;
  /// shown on the lines of steps that did not validate. Empty: none yet.
  nlohmann::json last_validation = nlohmann::json::object();
  int64_t last_validation_step = 0;
};

/// "1:02:03": whole seconds (rounded) as h:mm:ss; negative or non-finite seconds give "?".
std::string format_duration(double seconds);

/// "step 3/40 [=                   ] score 0.410 pg_loss 0.013 | 2.10 s/step 512 tok/s ETA 0:01:19 |
/// val-core/arithmetic/acc/mean@1 0.500 (step 0)": a 20-wide bar, then whichever the metrics hold of
/// critic/score/mean ("score"), val-core/* (by name), actor/pg_loss ("pg_loss"), train/loss
/// ("loss"), val/loss (by name); after a bar, timing_s/step, perf/throughput ("tok/s") and the ETA;
/// after another, the last validation of an earlier step.
std::string format_progress(const nlohmann::json& metrics, int64_t step, int64_t total,
                            const ProgressExtras& extras = {});

/// How a ConsoleTracker prints; the defaults are the console's.
struct ConsoleOptions {
  std::ostream* out = &std::cout;
  /// Whether `out` is a terminal; unset: `out` is std::cout and isatty(fileno(stdout)).
  std::optional<bool> terminal;
  /// Seconds on a steady clock, for the ETA; empty: std::chrono::steady_clock.
  std::function<double()> clock;
};

class ConsoleTracker : public Tracker {
 public:
  /// Every how many steps a line is printed: RunInfo::console_every, or when 0 (the default), 1 on a
  /// terminal and 10 elsewhere (a pipe, `tee`, a log file).
  explicit ConsoleTracker(const RunInfo& run, ConsoleOptions options = {});
  /// Prints nothing: the config is long, and the run folder keeps it (docs/observing.md).
  void log_config(const nlohmann::json& config) override;
  /// format_progress of the step against RunInfo::total_steps when the step is printed: every
  /// console_every-th step, and always the first logged step, the first trained step, a step that
  /// validated (val-core/* or val/loss) and the last step.
  void log(const nlohmann::json& metrics, int64_t step) override;
  void flush() override;
  void close() override;

  int64_t console_every() const { return every_; }

 private:
  /// Mean seconds per step over the recent logged steps (wall clock between log calls) times the
  /// steps left; unset before the second logged step and at the last step.
  std::optional<double> eta(int64_t step) const;

  std::ostream& out_;
  std::function<double()> clock_;
  int64_t total_steps_;
  int64_t resumed_step_;
  int64_t every_;
  int64_t logged_ = 0;
  std::deque<std::pair<int64_t, double>> recent_;  ///< (step, clock) of the last logged steps
  ProgressExtras extras_;
};

}  // namespace hyflow::tracking
