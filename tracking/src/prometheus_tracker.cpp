// The "prometheus" tracker: gauges set from each step's metrics, served by a metrics::Server.
#include <hyflow/core/error.hpp>
#include <hyflow/metrics/process_metrics.hpp>
#include <hyflow/tracking/prometheus_tracker.hpp>

#include <chrono>
#include <iostream>

namespace hyflow::tracking {

namespace {

constexpr const char* kPhasePrefix = "timing_s/";
constexpr const char* kStalenessPrefix = "training/off_policy/trajectory_staleness/";

/// The figures that map one to one to a gauge without labels.
struct Figure {
  const char* key;
  const char* name;
  const char* help;
};
constexpr Figure kFigures[] = {
    {"perf/throughput", "hyflow_trainer_throughput_tokens_per_second",
     "Tokens per second per worker in the last step (perf/throughput)."},
    {"training/off_policy/rollout_weight_version", "hyflow_trainer_rollout_weight_version",
     "The weight version (a step) new rollouts generate with (async pipeline)."},
    {"training/off_policy/queued_batches", "hyflow_trainer_rollout_queue_batches",
     "Rollout batches launched ahead and not yet trained on (async pipeline)."},
};

}  // namespace

void check_prometheus_endpoint(const PrometheusEndpoint& endpoint) {
  if (!endpoint.port)
    throw ValueError(
        "config key 'trainer.prometheus.port' is required when trainer.logger names 'prometheus' "
        "(0: any free port)");
  if (*endpoint.port < 0 || *endpoint.port > 65535)
    throw ValueError("config key 'trainer.prometheus.port' must be in 0-65535, got " + std::to_string(*endpoint.port));
  if (!endpoint.token_file && !metrics::is_loopback(endpoint.bind))
    throw ValueError("config key 'trainer.prometheus.bind' is '" + endpoint.bind +
                     "', not a loopback address: it needs trainer.prometheus.token_file");
}

PrometheusTracker::PrometheusTracker(const RunInfo& run) {
  const PrometheusEndpoint& e = run.prometheus;
  check_prometheus_endpoint(e);
  metrics::ServerOptions options;
  options.bind = e.bind;
  options.port = static_cast<int>(*e.port);
  if (e.token_file) options.token = metrics::read_token_file(*e.token_file);
  metrics::add_process_collector(registry_);
  registry_
      .gauge("hyflow_trainer_info", "The run this trainer serves (always 1).",
             {{"project", run.project_name}, {"experiment", run.experiment_name}})
      .set(1);
  registry_.gauge("hyflow_trainer_total_steps", "Steps the run will train.").set(static_cast<double>(run.total_steps));
  server_ = std::make_unique<metrics::Server>(registry_, options);
  std::cerr << "prometheus tracker: metrics on http://" << server_->address() << "/metrics"
            << (options.token.empty() ? "" : " (bearer token required)") << std::endl;
}

PrometheusTracker::~PrometheusTracker() = default;

void PrometheusTracker::log_config(const nlohmann::json&) {}

void PrometheusTracker::set(const std::string& name, const std::string& help, const metrics::Labels& labels,
                            const nlohmann::json& v) {
  if (v.is_number()) registry_.gauge(name, help, labels).set(v.get<double>());
}

void PrometheusTracker::log(const nlohmann::json& metrics, int64_t step) {
  if (!server_) throw ValueError("prometheus tracker: log after close()");
  registry_.gauge("hyflow_trainer_step", "The last step logged.").set(static_cast<double>(step));
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  registry_.gauge("hyflow_trainer_last_log_timestamp_seconds", "Unix time of the last step logged.").set(now);
  if (!metrics.is_object()) return;
  for (const auto& f : kFigures)
    if (auto it = metrics.find(f.key); it != metrics.end()) set(f.name, f.help, {}, *it);
  for (const auto& [key, value] : metrics.items()) {
    if (key.rfind(kPhasePrefix, 0) == 0)
      set("hyflow_trainer_phase_seconds", "Seconds the last step spent in each phase (timing_s/<phase>).",
          {{"phase", key.substr(std::char_traits<char>::length(kPhasePrefix))}}, value);
    else if (key.rfind(kStalenessPrefix, 0) == 0)
      set("hyflow_trainer_trajectory_staleness_steps",
          "Steps between the trained weights and the weights that generated the last batch "
          "(training/off_policy/trajectory_staleness/<stat>).",
          {{"stat", key.substr(std::char_traits<char>::length(kStalenessPrefix))}}, value);
  }
}

void PrometheusTracker::flush() {}

void PrometheusTracker::close() {
  server_.reset();
}

}  // namespace hyflow::tracking
