// The "prometheus" tracker: trainer.prometheus.* checks, the gauges a step sets, and the
// endpoint it serves while the run lives.
#include "http_get.hpp"
#include "trainer_step_metrics.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/tracking/all.hpp>

#include <catch2/catch.hpp>

#include <fstream>

using namespace hyflow::tracking;
using namespace metrics_test;

namespace {

RunInfo run_on(std::optional<int64_t> port, std::string bind = "127.0.0.1",
               std::optional<std::string> token_file = std::nullopt) {
  RunInfo run{.project_name = "proj", .experiment_name = "exp \"1\"", .total_steps = 40};
  run.prometheus = {.port = port, .bind = std::move(bind), .token_file = std::move(token_file)};
  return run;
}

PrometheusTracker& as_prometheus(Tracker& t) {
  return dynamic_cast<PrometheusTracker&>(t);
}

}  // namespace

TEST_CASE("prometheus is a registered tracker; its endpoint keys are checked first") {
  CHECK(has_tracker("prometheus"));
  CHECK_THROWS_WITH(make_tracker("prometheus", run_on(std::nullopt)),
                    Catch::Contains("'trainer.prometheus.port' is required"));
  CHECK_THROWS_WITH(check_prometheus_endpoint({.port = 70000}), Catch::Contains("must be in 0-65535"));
  CHECK_THROWS_WITH(check_prometheus_endpoint({.port = 0, .bind = "0.0.0.0"}),
                    Catch::Contains("needs trainer.prometheus.token_file"));
  CHECK_NOTHROW(check_prometheus_endpoint({.port = 0, .bind = "0.0.0.0", .token_file = "/x"}));
  CHECK_THROWS_AS(make_tracker("prometheus", run_on(0, "127.0.0.1", "/no/such/token")), hyflow::ValueError);
}

TEST_CASE("a step's figures become gauges: step, throughput, phases, weight version, staleness, queue") {
  auto tracker = make_tracker("prometheus", run_on(0));
  auto& p = as_prometheus(*tracker);
  REQUIRE(p.port() > 0);
  const std::string before = body_of(get(p.port()));
  CHECK(before.find("hyflow_trainer_info{project=\"proj\",experiment=\"exp \\\"1\\\"\"} 1\n") != std::string::npos);
  CHECK(before.find("hyflow_trainer_total_steps 40\n") != std::string::npos);
  CHECK(before.find("hyflow_trainer_step") == std::string::npos);  // nothing logged yet: no series
  CHECK(before.find("process_resident_memory_bytes ") != std::string::npos);

  tracker->log(async_ppo_step_metrics(), 7);
  const std::string text = body_of(get(p.port()));
  for (const char* series :
       {"hyflow_trainer_step 7\n", "hyflow_trainer_throughput_tokens_per_second 1234.5\n",
        "hyflow_trainer_phase_seconds{phase=\"gen\"} 1.5\n",
        "hyflow_trainer_phase_seconds{phase=\"update_weights\"} 0.125\n",
        "hyflow_trainer_phase_seconds{phase=\"step\"} 3.25\n", "hyflow_trainer_rollout_weight_version 6\n",
        "hyflow_trainer_trajectory_staleness_steps{stat=\"mean\"} 0.5\n",
        "hyflow_trainer_trajectory_staleness_steps{stat=\"max\"} 1\n", "hyflow_trainer_rollout_queue_batches 2\n",
        "# TYPE hyflow_trainer_phase_seconds gauge\n"})
    CHECK(text.find(series) != std::string::npos);
  CHECK(text.find("staleness_worst") == std::string::npos);
  CHECK(text.find("pg_loss") == std::string::npos);

  // the next step overwrites; a figure it lacks keeps its last value
  tracker->log({{"timing_s/gen", 2.0}}, 8);
  const std::string next = p.registry().expose();
  CHECK(next.find("hyflow_trainer_step 8\n") != std::string::npos);
  CHECK(next.find("hyflow_trainer_phase_seconds{phase=\"gen\"} 2\n") != std::string::npos);
  CHECK(next.find("hyflow_trainer_rollout_queue_batches 2\n") != std::string::npos);

  const int port = p.port();
  tracker->close();
  CHECK(p.port() == 0);
  CHECK_THROWS(connect_local(port));  // no longer served
  CHECK_THROWS_AS(tracker->log({}, 9), hyflow::ValueError);
}

TEST_CASE("with trainer.prometheus.token_file the endpoint wants the token") {
  const std::string path = "/tmp/hyflow_prom_tracker_token_" + std::to_string(::getpid());
  { std::ofstream(path) << "tok-123\n"; }
  auto tracker = make_tracker("prometheus", run_on(0, "127.0.0.1", path));
  const int port = as_prometheus(*tracker).port();
  CHECK(status_of(get(port)) == 401);
  CHECK(status_of(get(port, "/metrics", "Authorization: Bearer tok-123\r\n")) == 200);
  std::remove(path.c_str());
}

TEST_CASE("Tracking fans out to prometheus beside the other trackers") {
  Tracking tracking({"prometheus"}, run_on(0));
  tracking.log(async_ppo_step_metrics(), 3);
  tracking.close();
}
