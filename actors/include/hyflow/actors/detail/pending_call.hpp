#pragma once
// One in-flight call of a worker group: per-rank results, errors and answer times, filled in
// by the transport (CAF reply handlers, down messages, the watchdog) and awaited by the
// controller. Plain C++: the call pipeline does not see CAF.

#include <hyflow/actors/value.hpp>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::actors {

/// What the watchdog reports when a call passes its deadline.
struct DeadlineReport {
  std::string method;
  /// Ranks that had not answered.
  std::vector<int> ranks;
  std::chrono::milliseconds elapsed{0};
};

namespace detail {

struct PendingCall {
  using Clock = std::chrono::steady_clock;

  std::string method;  ///< name as sent (with a role prefix for colocated views)
  std::vector<int> ranks;  ///< executed ranks, in order; index i below is ranks[i]
  std::vector<std::vector<Value>> args;  ///< per executed rank
  int world_size = 0;
  Clock::time_point start = Clock::now();
  std::optional<Clock::time_point> deadline;
  /// Set: the watchdog only reports; unset: the call fails with CallTimeoutError.
  std::function<void(const DeadlineReport&)> on_deadline;
  /// Runs once, after the last rank answered or failed, on the thread that completed it.
  std::function<void(PendingCall&)> on_complete;
  /// True on a thread while it runs an on_complete (and the continuations it triggers): a
  /// blocking call there would wait for the thread it blocks (the group's collector).
  static bool in_completion();

  PendingCall(std::string method, std::vector<int> ranks, std::vector<std::vector<Value>> args, int world_size);
  /// Runs the cleanups of ranks that never settled.
  ~PendingCall();
  PendingCall(const PendingCall&) = delete;
  PendingCall& operator=(const PendingCall&) = delete;

  void deliver(size_t index, Value value);
  void fail(size_t index, std::exception_ptr error);
  /// Index of `rank` in ranks, or -1.
  int index_of(int rank) const;
  bool done() const;
  void wait() const;
  /// Ranks without an answer yet.
  std::vector<int> unanswered() const;
  /// Marks the deadline reported (true the first time).
  bool take_deadline_report();
  /// True once index `index` was answered or failed.
  bool settled(size_t index) const;
  /// Runs `fn` once index `index` settles (answered, failed, timed out), at once when it has;
  /// the transport frees what it holds for that rank (data plane objects).
  void on_settled(size_t index, std::function<void()> fn);

  /// After done(): outputs in rank order, or throws one error naming the method and the
  /// lowest failed rank (and how many others failed).
  std::vector<Value> take_outputs();
  /// Microseconds from start to each rank's answer.
  std::vector<double> answer_us() const;

 private:
  void finish_one_locked(std::unique_lock<std::mutex>& lock);
  void run_cleanups(size_t index, std::unique_lock<std::mutex>& lock);
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::vector<std::optional<Value>> results_;
  std::vector<std::exception_ptr> errors_;
  std::vector<Clock::time_point> answered_at_;
  std::vector<std::vector<std::function<void()>>> cleanups_;
  size_t remaining_;
  bool deadline_reported_ = false;
};

}  // namespace detail
}  // namespace hyflow::actors
