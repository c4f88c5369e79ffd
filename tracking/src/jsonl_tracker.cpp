// The JSONL tracker: settles an earlier run's metrics file, then appends a line per step.
#include <hyflow/core/error.hpp>
#include <hyflow/core/files.hpp>
#include <hyflow/tracking/jsonl_tracker.hpp>

#include <iostream>

namespace hyflow::tracking {

namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out) throw Error("cannot write " + path.string());
}

/// A fresh run moves the earlier run's file aside; a run resumed at step S moves the lines the
/// earlier run logged after S (it takes those steps again) to a side file.
void settle_earlier_run(const fs::path& file, int64_t resumed_step) {
  if (!fs::exists(file)) return;
  if (resumed_step == 0) {
    const fs::path old = free_path(file, ".old");
    fs::rename(file, old);
    std::cout << "metrics of an earlier run moved to " << old.string() << "\n";
    return;
  }
  std::ifstream in(file);
  std::string kept, later, line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.empty()) continue;
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_object() || !row.contains("step") || !row.at("step").is_number_integer())
      throw FormatError(file.string() + ":" + std::to_string(lineno) + ": not a metrics line with an integer step");
    (row.at("step").get<int64_t>() <= resumed_step ? kept : later) += line + "\n";
  }
  in.close();
  if (later.empty()) return;
  const fs::path side = free_path(file, ".after_step_" + std::to_string(resumed_step));
  write_text(side, later);
  write_text_atomically(file, kept);
  std::cout << "metrics logged after step " << resumed_step << " by the earlier run moved to " << side.string() << "\n";
}

}  // namespace

JsonlTracker::JsonlTracker(const RunInfo& run) : file_(run.metrics_file) {
  if (file_.empty()) throw ValueError("the jsonl tracker needs a metrics file (trainer.metrics_file)");
  settle_earlier_run(file_, run.resumed_step);
}

void JsonlTracker::log_config(const nlohmann::json&) {}

void JsonlTracker::log(const nlohmann::json& metrics, int64_t step) {
  if (!out_.is_open()) {
    if (file_.has_parent_path()) fs::create_directories(file_.parent_path());
    out_.open(file_, std::ios::app);
  }
  nlohmann::json line = metrics;
  line["step"] = step;
  out_ << line.dump() << "\n";
  out_.flush();
  if (!out_) throw Error("cannot write " + file_.string());
}

void JsonlTracker::flush() {
  if (out_.is_open()) out_.flush();
}

void JsonlTracker::close() {
  if (!out_.is_open()) return;
  out_.close();
  if (!out_) throw Error("cannot write " + file_.string());
}

}  // namespace hyflow::tracking
