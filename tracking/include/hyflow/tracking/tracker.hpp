#pragma once
// Tracker: one destination of a run's metrics (the console, a JSONL file, an experiment
// tracker). Trainers never call trackers directly: they log through Tracking, which fans out to
// the trackers named by trainer.logger (tracker_registry.hpp).

#include <nlohmann/json.hpp>

#include <cstdint>

namespace hyflow::tracking {

class Tracker {
 public:
  virtual ~Tracker();
  /// The run's resolved config (a JSON object), once, before the first step.
  virtual void log_config(const nlohmann::json& config) = 0;
  /// The metrics of one step: a JSON object of name -> value.
  virtual void log(const nlohmann::json& metrics, int64_t step) = 0;
  /// Pushes what is buffered to its destination.
  virtual void flush() = 0;
  /// Flushes and releases the destination; called once, and nothing is logged after it.
  virtual void close() = 0;
};

}  // namespace hyflow::tracking
