#pragma once
// The "tensorboard" tracker: TensorBoard event files (verl's tensorboard logger), written
// without TensorFlow. docs/tracking.md, "tensorboard", has the file layout and the tags.
//
// - Folder: $TENSORBOARD_DIR when set (verl's variable), else `{RunInfo::local_dir}/tensorboard`.
// - File: `events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>` (TensorFlow's naming; n
//   counts the files this process opened), TFRecord-framed Event protos (tfrecord.hpp). The
//   first event holds file_version "brain.Event:2".
// - log(metrics, step): one Event per step; each number (float, integer, boolean) becomes a
//   rank-0 DT_FLOAT tensor with the "scalars" plugin's metadata: the logged double rounded once
//   to float32 (TensorBoard's scalar type; the exact doubles stay in metrics.jsonl). Other
//   values (strings, null, lists, objects) are skipped. Every event is flushed when written: a
//   crash loses at most the record being written, and a reader still gets every record before it.
// - log_config(config): the config as indented JSON in a text summary (tag "config", the
//   "text" plugin), at step 0.
// - A fresh run (resumed_step 0) moves the event files an earlier run left in the folder to a
//   sibling folder `<folder>.old` (`.old.1`, ... when taken), so TensorBoard does not merge two
//   runs into one. A run resumed at step S keeps them and starts a new file with a SessionLog
//   START at step S + 1: TensorBoard drops what earlier files logged at steps after S.

#include <hyflow/tracking/run_info.hpp>
#include <hyflow/tracking/tracker.hpp>

#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

namespace hyflow::tracking {

/// Where the tensorboard tracker of `run` writes: $TENSORBOARD_DIR, else `{local_dir}/tensorboard`.
/// ValueError when neither is set.
std::filesystem::path tensorboard_dir(const RunInfo& run);

class TensorBoardTracker : public Tracker {
 public:
  /// Creates the folder, settles an earlier run's files (above) and opens a new event file with
  /// its file_version event. Error naming the file when it cannot be created.
  explicit TensorBoardTracker(const RunInfo& run);
  ~TensorBoardTracker() override;
  TensorBoardTracker(const TensorBoardTracker&) = delete;
  TensorBoardTracker& operator=(const TensorBoardTracker&) = delete;

  void log_config(const nlohmann::json& config) override;
  void log(const nlohmann::json& metrics, int64_t step) override;
  void flush() override;
  void close() override;

  const std::filesystem::path& event_file() const { return file_; }

 private:
  /// Appends one serialized Event as a record and flushes it.
  void write_record(const std::string& event);

  std::filesystem::path file_;
  std::FILE* out_ = nullptr;
  std::set<std::string> tags_described_;  ///< tags whose metadata this file already holds
};

}  // namespace hyflow::tracking
