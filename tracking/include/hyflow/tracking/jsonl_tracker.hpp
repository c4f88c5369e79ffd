#pragma once
// The "jsonl" tracker (verl's "file" logger, same name accepted): one JSON object per step, with
// its "step", appended to RunInfo::metrics_file.
//
// Created for a run, it first settles what an earlier run left in the file:
// - a fresh run (resumed_step 0) moves an existing file to `<file>.old` (`.old.1`, `.old.2`, ...
//   when taken: nothing is overwritten), so the file holds this run only;
// - a run resumed at step S keeps the lines with step <= S and moves the later ones (logged by
//   the earlier run after its last checkpoint, which this run takes again) to
//   `<file>.after_step_S` (numbered the same way); the file is rewritten atomically.
// A line that is not a JSON object with an integer "step" is a FormatError naming file:line.
// The config is not written here: the trainers record it, with each key's source, in the run
// folder's config.yaml and run.json (docs/observing.md), one place for it.

#include <hyflow/tracking/run_info.hpp>
#include <hyflow/tracking/tracker.hpp>

#include <filesystem>
#include <fstream>

namespace hyflow::tracking {

class JsonlTracker : public Tracker {
 public:
  /// Settles the earlier run's file (above); ValueError when RunInfo::metrics_file is empty.
  explicit JsonlTracker(const RunInfo& run);
  /// Writes nothing: the run folder keeps the config (above).
  void log_config(const nlohmann::json& config) override;
  /// Appends the line (parent folders created on the first one) and flushes it.
  void log(const nlohmann::json& metrics, int64_t step) override;
  void flush() override;
  void close() override;

  const std::filesystem::path& metrics_file() const { return file_; }

 private:
  std::filesystem::path file_;
  std::ofstream out_;
};

}  // namespace hyflow::tracking
