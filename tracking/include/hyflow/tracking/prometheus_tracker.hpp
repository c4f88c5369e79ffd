#pragma once
// The "prometheus" tracker: the run's headline figures as Prometheus gauges, served on
// GET /metrics (hyflow/metrics/server.hpp) at trainer.prometheus.port while the run lives.
// Each log() sets the gauges of the figures the step holds (docs/metrics.md, "The trainer"):
//   hyflow_trainer_step                                   the step logged
//   hyflow_trainer_throughput_tokens_per_second          perf/throughput (per worker)
//   hyflow_trainer_phase_seconds{phase}                   timing_s/<phase>
//   hyflow_trainer_rollout_weight_version                 training/off_policy/rollout_weight_version
//   hyflow_trainer_trajectory_staleness_steps{stat}       training/off_policy/trajectory_staleness/{mean,max,min}
//   hyflow_trainer_rollout_queue_batches                  training/off_policy/queued_batches
// A figure the run never logged has no series (never a made-up 0).

#include <hyflow/metrics/registry.hpp>
#include <hyflow/metrics/server.hpp>
#include <hyflow/tracking/run_info.hpp>
#include <hyflow/tracking/tracker.hpp>

#include <memory>

namespace hyflow::tracking {

/// The checks of trainer.prometheus.* when trainer.logger names the tracker: ValueError naming
/// the key for a missing port, a port out of 0-65535, or a bind address other than loopback
/// without a token file. Trainers run it when they read their config.
void check_prometheus_endpoint(const PrometheusEndpoint& endpoint);

class PrometheusTracker : public Tracker {
 public:
  /// Checks the endpoint, reads the token file and starts serving; prints the address on stderr.
  explicit PrometheusTracker(const RunInfo& run);
  ~PrometheusTracker() override;
  /// Nothing: the config is not a time series.
  void log_config(const nlohmann::json& config) override;
  void log(const nlohmann::json& metrics, int64_t step) override;
  void flush() override;
  /// Stops serving.
  void close() override;

  const metrics::Registry& registry() const { return registry_; }
  /// The port served (the chosen one for port 0); 0 after close().
  int port() const { return server_ ? server_->port() : 0; }

 private:
  void set(const std::string& name, const std::string& help, const metrics::Labels& labels, const nlohmann::json& v);

  metrics::Registry registry_;
  std::unique_ptr<metrics::Server> server_;
};

}  // namespace hyflow::tracking
