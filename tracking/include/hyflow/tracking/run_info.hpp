#pragma once
// RunInfo: what a tracker learns about the run it records when it is created.

#include <cstdint>
#include <optional>
#include <string>

namespace hyflow::tracking {

/// trainer.prometheus.*: where the "prometheus" tracker serves GET /metrics (docs/metrics.md).
struct PrometheusEndpoint {
  std::optional<int64_t> port;  ///< required with the tracker; 0: a free port (printed)
  std::string bind = "127.0.0.1";
  std::optional<std::string> token_file;  ///< a bearer token; required to bind other than loopback
};

struct RunInfo {
  std::string project_name;     ///< trainer.project_name
  std::string experiment_name;  ///< trainer.experiment_name
  std::string local_dir;        ///< trainer.default_local_dir, resolved
  std::string metrics_file;     ///< the JSONL metrics path (trainer.metrics_file, resolved)
  int64_t total_steps = 0;      ///< steps the run will train
  int64_t resumed_step = 0;     ///< the checkpoint step the run resumes from; 0: a fresh run
  /// trainer.console_every: the console prints every Nth step; 0: 1 on a terminal, 10 elsewhere.
  int64_t console_every = 0;
  PrometheusEndpoint prometheus;  ///< trainer.prometheus.*
};

}  // namespace hyflow::tracking
