#pragma once
// Tracking (verl's Tracking): the trackers named by trainer.logger for one run, logged to
// together. Every name is checked before any tracker is created, so a typo fails the run
// before it writes anything.

#include <hyflow/tracking/run_info.hpp>
#include <hyflow/tracking/tracker.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::tracking {

/// The tracker names of a trainer.logger value (a JSON list of strings); ValueError naming
/// trainer.logger for anything else.
std::vector<std::string> logger_backends(const nlohmann::json& trainer_logger);

/// The checks of Tracking's constructor, without creating a tracker: KeyError for an unknown
/// name, ValueError for a tracker listed twice (an alias included). Trainers run it when they
/// read their config, before anything is launched.
void check_backends(const std::vector<std::string>& backends);

class Tracking {
 public:
  /// Creates the trackers of `backends` in list order. An unknown name anywhere in the list is a
  /// KeyError with a suggestion; a tracker listed twice (an alias included: "file" is "jsonl")
  /// is a ValueError. An empty list tracks nothing.
  Tracking(const std::vector<std::string>& backends, const RunInfo& run);
  /// Closes the trackers; a tracker that fails to close is reported on stderr, never thrown.
  ~Tracking();
  Tracking(const Tracking&) = delete;
  Tracking& operator=(const Tracking&) = delete;

  /// The resolved config, once per run, to every tracker; ValueError after close().
  void log_config(const nlohmann::json& config);
  /// One step's metrics (a JSON object) to every tracker; ValueError after close().
  void log(const nlohmann::json& metrics, int64_t step);
  /// Flushes every tracker (nothing after close()).
  void flush();
  /// Closes every tracker (all are tried; the first failure is rethrown). A second call does
  /// nothing.
  void close();

  /// The tracker names, in list order.
  const std::vector<std::string>& backends() const { return backends_; }

 private:
  std::vector<std::string> backends_;
  std::vector<std::unique_ptr<Tracker>> trackers_;
  bool closed_ = false;
};

}  // namespace hyflow::tracking
