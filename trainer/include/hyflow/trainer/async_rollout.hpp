#pragma once
// Pieces of the asynchronous trainer (trainer.v1.trainer_mode=separate_async, docs/trainer.md):
// the serial executor that makes the rollout group's calls in submission order while the
// controller trains, and verl's off-policy metrics of a trained batch.

#include <hyflow/dataproto/data_proto.hpp>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace hyflow::trainer {

/// One thread that runs tasks one at a time in the order they were submitted (a task may
/// submit its own continuation, which then queues behind what was submitted meanwhile). The
/// first task to throw marks the executor failed: failure() returns that error from then on, so
/// later tasks can fail fast instead of running on a rollout group in an unknown state.
class SerialExecutor {
 public:
  SerialExecutor();
  /// Drops the tasks not started yet, lets the running one finish and joins.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void submit(std::function<void()> task);
  /// Drops the tasks not started yet and waits for the running one.
  void drain();
  /// The first error a task threw (null: none).
  std::exception_ptr failure() const;

 private:
  void run();
  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr failure_;
  std::thread thread_;
};

/// verl's off-policy metrics of a batch trained at weight version `trained_version` (the version
/// the update starts from), from the per-row min_weight_version / max_weight_version columns:
/// training/off_policy/trajectory_spans/{mean,max,min} (versions within a trajectory, max - min
/// + 1), trajectory_staleness/* (trained - max: the newest version used) and
/// trajectory_staleness_worst/* (trained - min). KeyError naming a missing column.
nlohmann::json off_policy_metrics(const DataProto& batch, int64_t trained_version);

}  // namespace hyflow::trainer
