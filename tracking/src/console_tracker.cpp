// The console tracker: a progress line per printed step, with the ETA and the last validation.
#include <hyflow/tracking/console_tracker.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

namespace hyflow::tracking {

namespace {

/// Steps (intervals between logged steps) the ETA averages over.
constexpr size_t kEtaWindow = 10;
/// console_every when stdout is not a terminal and the config leaves it at 0.
constexpr int64_t kQuietEvery = 10;

bool is_validation(const std::string& key) {
  return key.rfind("val-core/", 0) == 0;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  std::ostringstream os;
  os << total / 3600 << ":" << std::setfill('0') << std::setw(2) << total / 60 % 60 << ":" << std::setw(2)
     << total % 60;
  return os.str();
}

std::string format_progress(const nlohmann::json& m, int64_t step, int64_t total, const ProgressExtras& extras) {
  std::ostringstream os;
  constexpr int kWidth = 20;
  const int filled = total > 0 ? static_cast<int>(kWidth * std::min(step, total) / total) : 0;
  os << "step " << step << "/" << total << " [" << std::string(static_cast<size_t>(filled), '=')
     << std::string(static_cast<size_t>(kWidth - filled), ' ') << "]" << std::fixed << std::setprecision(3);
  if (m.contains("critic/score/mean")) os << " score " << m["critic/score/mean"].get<double>();
  bool validated = false;
  for (const auto& [k, v] : m.items())
    if (is_validation(k)) {
      os << " " << k << " " << v.get<double>();
      validated = true;
    }
  if (m.contains("actor/pg_loss")) os << " pg_loss " << m["actor/pg_loss"].get<double>();
  if (m.contains("train/loss")) os << " loss " << m["train/loss"].get<double>();
  if (m.contains("val/loss")) {
    os << " val/loss " << m["val/loss"].get<double>();
    validated = true;
  }
  std::string speed;
  {
    std::ostringstream s;
    s << std::fixed;
    if (m.contains("timing_s/step")) s << " " << std::setprecision(2) << m["timing_s/step"].get<double>() << " s/step";
    if (m.contains("perf/throughput"))
      s << " " << std::setprecision(0) << m["perf/throughput"].get<double>() << " tok/s";
    if (extras.eta_s) s << " ETA " << format_duration(*extras.eta_s);
    speed = s.str();
  }
  if (!speed.empty()) os << " |" << speed;
  if (!validated && !extras.last_validation.empty()) {
    os << " |";
    for (const auto& [k, v] : extras.last_validation.items()) os << " " << k << " " << v.get<double>();
    os << " (step " << extras.last_validation_step << ")";
  }
  return os.str();
}

ConsoleTracker::ConsoleTracker(const RunInfo& run, ConsoleOptions options)
    : out_(*options.out),
      clock_(options.clock ? std::move(options.clock) : std::function<double()>(steady_seconds)),
      total_steps_(run.total_steps),
      resumed_step_(run.resumed_step) {
  const bool terminal = options.terminal.value_or(options.out == &std::cout && ::isatty(::fileno(stdout)) == 1);
  every_ = run.console_every > 0 ? run.console_every : terminal ? 1 : kQuietEvery;
}

void ConsoleTracker::log_config(const nlohmann::json&) {}

std::optional<double> ConsoleTracker::eta(int64_t step) const {
  if (recent_.size() < 2 || step >= total_steps_) return std::nullopt;
  const auto& [first_step, first_time] = recent_.front();
  const auto& [last_step, last_time] = recent_.back();
  if (last_step <= first_step) return std::nullopt;
  const double per_step = (last_time - first_time) / static_cast<double>(last_step - first_step);
  return per_step * static_cast<double>(total_steps_ - step);
}

void ConsoleTracker::log(const nlohmann::json& metrics, int64_t step) {
  recent_.emplace_back(step, clock_());
  if (recent_.size() > kEtaWindow + 1) recent_.pop_front();
  bool validated = metrics.contains("val/loss");
  for (const auto& [k, v] : metrics.items()) validated = validated || is_validation(k);
  const bool print =
      logged_ == 0 || step == resumed_step_ + 1 || validated || step >= total_steps_ || step % every_ == 0;
  ++logged_;
  if (print) {
    extras_.eta_s = eta(step);
    out_ << format_progress(metrics, step, total_steps_, extras_) << std::endl;
  }
  if (validated) {
    extras_.last_validation = nlohmann::json::object();
    for (const auto& [k, v] : metrics.items())
      if (is_validation(k) || k == "val/loss") extras_.last_validation[k] = v;
    extras_.last_validation_step = step;
  }
}

void ConsoleTracker::flush() {
  out_.flush();
}

void ConsoleTracker::close() {
  out_.flush();
}

}  // namespace hyflow::tracking
