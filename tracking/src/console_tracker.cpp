// The console tracker: a progress line per step.
#include <hyflow/tracking/console_tracker.hpp>

#include <iomanip>
#include <sstream>

namespace hyflow::tracking {

std::string format_progress(const nlohmann::json& m, int64_t step, int64_t total) {
  std::ostringstream os;
  constexpr int kWidth = 20;
  const int filled = total > 0 ? static_cast<int>(kWidth * step / total) : 0;
  os << "step " << step << "/" << total << " [" << std::string(static_cast<size_t>(filled), '=')
     << std::string(static_cast<size_t>(kWidth - filled), ' ') << "]" << std::fixed << std::setprecision(3);
  if (m.contains("critic/score/mean")) os << " score " << m["critic/score/mean"].get<double>();
  for (const auto& [k, v] : m.items())
    if (k.rfind("val-core/", 0) == 0) os << " " << k << " " << v.get<double>();
  if (m.contains("actor/pg_loss")) os << " pg_loss " << m["actor/pg_loss"].get<double>();
  if (m.contains("train/loss")) os << " loss " << m["train/loss"].get<double>();
  if (m.contains("val/loss")) os << " val/loss " << m["val/loss"].get<double>();
  if (m.contains("timing_s/step")) os << " | " << std::setprecision(2) << m["timing_s/step"].get<double>() << " s/step";
  return os.str();
}

ConsoleTracker::ConsoleTracker(const RunInfo& run, std::ostream& out) : out_(out), total_steps_(run.total_steps) {}

void ConsoleTracker::log_config(const nlohmann::json&) {}

void ConsoleTracker::log(const nlohmann::json& metrics, int64_t step) {
  out_ << format_progress(metrics, step, total_steps_) << std::endl;
}

void ConsoleTracker::flush() {
  out_.flush();
}

void ConsoleTracker::close() {
  out_.flush();
}

}  // namespace hyflow::tracking
