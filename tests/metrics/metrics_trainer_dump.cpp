// Prints what the "prometheus" tracker serves after one async PPO step (trainer_step_metrics.hpp),
// scraped over HTTP from its endpoint: the trainer's input to promtool_check.sh.
#include "http_get.hpp"
#include "trainer_step_metrics.hpp"

#include <hyflow/tracking/all.hpp>

#include <iostream>

int main() {
  try {
    using namespace hyflow::tracking;
    RunInfo run{.project_name = "hyflow", .experiment_name = "promtool", .total_steps = 40};
    run.prometheus.port = 0;
    auto tracker = make_tracker("prometheus", run);
    tracker->log(metrics_test::async_ppo_step_metrics(), 7);
    const std::string response = metrics_test::get(dynamic_cast<PrometheusTracker&>(*tracker).port());
    if (metrics_test::status_of(response) != 200) {
      std::cerr << "metrics_trainer_dump: the endpoint answered:\n" << response << "\n";
      return 1;
    }
    std::cout << metrics_test::body_of(response);
    tracker->close();
  } catch (const std::exception& e) {
    std::cerr << "metrics_trainer_dump: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
