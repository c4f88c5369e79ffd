// Tracking: the trackers of trainer.logger, checked together, then logged to in list order.
#include <hyflow/core/error.hpp>
#include <hyflow/tracking/tracker_registry.hpp>
#include <hyflow/tracking/tracking.hpp>

#include "resolve_tracker.hpp"

#include <exception>
#include <iostream>
#include <map>

namespace hyflow::tracking {

std::vector<std::string> logger_backends(const nlohmann::json& trainer_logger) {
  const auto bad = [&] {
    return ValueError("config key 'trainer.logger': expected a list of tracker names, got " + trainer_logger.dump());
  };
  if (!trainer_logger.is_array()) throw bad();
  std::vector<std::string> names;
  for (const auto& name : trainer_logger) {
    if (!name.is_string()) throw bad();
    names.push_back(name.get<std::string>());
  }
  return names;
}

void check_backends(const std::vector<std::string>& backends) {
  std::map<std::string, std::string> listed;  // tracker -> the name it was listed as
  for (const auto& name : backends) {
    const std::string tracker = detail::resolve_tracker(name);
    const auto [it, fresh] = listed.emplace(tracker, name);
    if (!fresh)
      throw ValueError("tracker '" + name + "' is listed twice in trainer.logger" +
                       (it->second == name ? std::string() : " (as '" + it->second + "' and '" + name + "')"));
  }
}

Tracking::Tracking(const std::vector<std::string>& backends, const RunInfo& run) : backends_(backends) {
  check_backends(backends_);
  for (const auto& name : backends_) trackers_.push_back(make_tracker(name, run));
}

Tracking::~Tracking() {
  try {
    close();
  } catch (const std::exception& e) {
    std::cerr << "tracking: closing the trackers failed: " << e.what() << std::endl;
  }
}

void Tracking::log_config(const nlohmann::json& config) {
  if (closed_) throw ValueError("tracking: the config logged after close()");
  for (auto& tracker : trackers_) tracker->log_config(config);
}

void Tracking::log(const nlohmann::json& metrics, int64_t step) {
  if (closed_) throw ValueError("tracking: step " + std::to_string(step) + " logged after close()");
  if (!metrics.is_object())
    throw ValueError("tracking: the metrics of step " + std::to_string(step) + " are not a JSON object");
  for (auto& tracker : trackers_) tracker->log(metrics, step);
}

void Tracking::flush() {
  if (closed_) return;
  for (auto& tracker : trackers_) tracker->flush();
}

void Tracking::close() {
  if (closed_) return;
  closed_ = true;
  std::exception_ptr first;
  for (auto& tracker : trackers_) {
    try {
      tracker->close();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace hyflow::tracking
