#pragma once
// A step timeline: spans of the controller's phases, of each worker-group call (dispatch and
// collect on the controller) and of each call's execution on every worker, written as a Chrome
// trace-event JSON file (Perfetto, chrome://tracing). Off by default: with no recorder active
// every hook below is one atomic load. docs/profiling.md, "Step timeline".

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace hyflow::actors {

/// One row of the timeline: a process (pid, "process_name") and a thread (tid, "thread_name").
struct TraceTrack {
  std::string process;
  std::string thread;
};

/// Records complete spans ("ph":"X") on tracks, in this process's steady clock. At most one
/// recorder is active in a process; spans that end while none records are dropped. The owner
/// keeps it alive until no worker of the recording's groups can still end a span (the trainer:
/// until its workers are stopped).
class CallTrace {
 public:
  using Clock = std::chrono::steady_clock;

  CallTrace() = default;
  ~CallTrace();
  CallTrace(const CallTrace&) = delete;
  CallTrace& operator=(const CallTrace&) = delete;

  /// The recorder spans go to, or null (recording off).
  static CallTrace* active() noexcept { return active_.load(std::memory_order_acquire); }

  /// Clears the events, sets the time origin to now, makes the calling thread the controller's
  /// track and this the active recorder. ValueError when another recorder is active.
  void start();
  /// Stops recording; later spans are dropped. Idempotent.
  void stop();

  /// A span [start, end] on `track`; dropped unless recording, or when it began before start().
  void add(const TraceTrack& track, std::string name, std::string category, Clock::time_point start,
           Clock::time_point end, nlohmann::json args = nullptr);
  /// A span on the calling thread's track (ThreadTrack's, the controller's, or "controller thread k").
  void add(std::string name, std::string category, Clock::time_point start, Clock::time_point end,
           nlohmann::json args = nullptr);
  /// A span a process sees from outside (a remote worker's call: request sent -> reply received):
  /// its start moves to the end of the track's previous span when they would overlap, since a
  /// worker runs its calls one at a time.
  void add_observed(const TraceTrack& track, std::string name, std::string category, Clock::time_point start,
                    Clock::time_point end, nlohmann::json args = nullptr);

  /// {"traceEvents": [...], "displayTimeUnit": "ms"}: metadata events naming every process and
  /// thread, then the spans in the order they ended (ts, dur in microseconds from start()).
  nlohmann::json to_json() const;
  /// Writes to_json() to `path` (parent folders created); hyflow::Error naming the path on failure.
  void write(const std::string& path) const;

  /// The track of worker `worker_name` ("{prefix}{type}_{node}:{local}") of rank `rank`: process
  /// "{prefix}{type}", thread "{prefix}{type} rank {rank}".
  static TraceTrack worker_track(const std::string& worker_name, int rank);
  /// The controller's own track.
  static TraceTrack controller_track() { return {"controller", "controller"}; }

 private:
  struct Event {
    int pid, tid;
    std::string name, category;
    int64_t start_ns, dur_ns;
    nlohmann::json args;
  };
  std::pair<int, int> ids_locked(const TraceTrack& track);
  TraceTrack current_track_locked();
  void add_locked(const TraceTrack& track, std::string name, std::string category, Clock::time_point start,
                  Clock::time_point end, nlohmann::json args);

  static inline std::atomic<CallTrace*> active_{nullptr};
  mutable std::mutex mutex_;
  bool recording_ = false;
  Clock::time_point origin_{};
  std::thread::id controller_thread_;
  std::map<std::string, int> pids_;                            // process name -> pid
  std::map<std::pair<int, std::string>, int> tids_;            // (pid, thread name) -> tid
  std::map<std::thread::id, int> other_threads_;               // unnamed threads -> k of "controller thread k"
  std::map<std::pair<int, int>, Clock::time_point> last_end_;  // per track, for add_observed
  std::vector<Event> events_;
};

/// Names the calling thread's track for its scope (a worker actor names its thread after its
/// worker); spans of the thread then land there. A default-constructed one names nothing.
class ThreadTrack {
 public:
  ThreadTrack() = default;
  explicit ThreadTrack(TraceTrack track);
  ~ThreadTrack();
  ThreadTrack(const ThreadTrack&) = delete;
  ThreadTrack& operator=(const ThreadTrack&) = delete;

 private:
  TraceTrack track_;
  const TraceTrack* previous_ = nullptr;
  bool set_ = false;
};

/// A span on the calling thread's track from construction to end() or destruction, named
/// `name` + `suffix`; when no recorder is active it costs one atomic load and copies nothing.
class TraceSpan {
 public:
  TraceSpan(std::string_view category, std::string_view name, std::string_view suffix = {})
      : trace_(CallTrace::active()) {
    if (trace_) begin(category, name, suffix);
  }
  ~TraceSpan() { end(); }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  /// Ends the span now (once).
  void end() {
    if (trace_) finish();
  }

 private:
  void begin(std::string_view category, std::string_view name, std::string_view suffix);
  void finish();
  CallTrace* trace_;
  std::string category_, name_;
  CallTrace::Clock::time_point start_{};
};

}  // namespace hyflow::actors
