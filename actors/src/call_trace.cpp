// The step timeline's recorder (call_trace.hpp): tracks as Chrome trace-event pids/tids, spans
// kept in nanoseconds from the origin and written in microseconds.
#include <hyflow/actors/call_trace.hpp>
#include <hyflow/core/error.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace hyflow::actors {

namespace {
thread_local const TraceTrack* thread_track = nullptr;

int64_t ns_between(CallTrace::Clock::time_point from, CallTrace::Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}
double us(int64_t ns) {
  return static_cast<double>(ns) / 1000.0;
}
}  // namespace

CallTrace::~CallTrace() {
  stop();
}

void CallTrace::start() {
  CallTrace* expected = nullptr;
  if (!active_.compare_exchange_strong(expected, this) && expected != this)
    throw ValueError("CallTrace::start: another step timeline is recording in this process");
  std::lock_guard lock(mutex_);
  events_.clear();
  pids_.clear();
  tids_.clear();
  other_threads_.clear();
  last_end_.clear();
  origin_ = Clock::now();
  controller_thread_ = std::this_thread::get_id();
  ids_locked(controller_track());  // the controller's track comes first, even when empty
  recording_ = true;
}

void CallTrace::stop() {
  CallTrace* self = this;
  active_.compare_exchange_strong(self, nullptr);
  std::lock_guard lock(mutex_);
  recording_ = false;
}

std::pair<int, int> CallTrace::ids_locked(const TraceTrack& track) {
  const int pid = pids_.emplace(track.process, static_cast<int>(pids_.size()) + 1).first->second;
  const int tid = tids_.emplace(std::pair(pid, track.thread), static_cast<int>(tids_.size()) + 1).first->second;
  return {pid, tid};
}

TraceTrack CallTrace::current_track_locked() {
  if (thread_track) return *thread_track;
  const auto id = std::this_thread::get_id();
  if (id == controller_thread_) return controller_track();
  const int k = other_threads_.emplace(id, static_cast<int>(other_threads_.size()) + 1).first->second;
  return {"controller", "controller thread " + std::to_string(k)};
}

void CallTrace::add_locked(const TraceTrack& track, std::string name, std::string category, Clock::time_point start,
                           Clock::time_point end, nlohmann::json args) {
  if (!recording_ || start < origin_) return;
  const auto [pid, tid] = ids_locked(track);
  events_.push_back(Event{pid, tid, std::move(name), std::move(category), ns_between(origin_, start),
                          std::max<int64_t>(0, ns_between(start, end)), std::move(args)});
}

void CallTrace::add(const TraceTrack& track, std::string name, std::string category, Clock::time_point start,
                    Clock::time_point end, nlohmann::json args) {
  std::lock_guard lock(mutex_);
  add_locked(track, std::move(name), std::move(category), start, end, std::move(args));
}

void CallTrace::add(std::string name, std::string category, Clock::time_point start, Clock::time_point end,
                    nlohmann::json args) {
  std::lock_guard lock(mutex_);
  if (!recording_) return;
  add_locked(current_track_locked(), std::move(name), std::move(category), start, end, std::move(args));
}

void CallTrace::add_observed(const TraceTrack& track, std::string name, std::string category, Clock::time_point start,
                             Clock::time_point end, nlohmann::json args) {
  std::lock_guard lock(mutex_);
  if (!recording_ || start < origin_) return;
  auto& last = last_end_[ids_locked(track)];
  start = std::min(std::max(start, last), end);
  last = std::max(last, end);
  add_locked(track, std::move(name), std::move(category), start, end, std::move(args));
}

nlohmann::json CallTrace::to_json() const {
  std::lock_guard lock(mutex_);
  nlohmann::json events = nlohmann::json::array();
  auto meta = [&](const char* what, int pid, int tid, const std::string& name) {
    events.push_back({{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"ts", 0}, {"args", {{"name", name}}}});
  };
  for (const auto& [process, pid] : pids_) {
    meta("process_name", pid, 0, process);
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 0},
                      {"ts", 0},
                      {"args", {{"sort_index", pid}}}});
  }
  for (const auto& [key, tid] : tids_) {
    meta("thread_name", key.first, tid, key.second);
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", key.first},
                      {"tid", tid},
                      {"ts", 0},
                      {"args", {{"sort_index", tid}}}});
  }
  for (const auto& e : events_) {
    nlohmann::json x = {{"name", e.name}, {"cat", e.category},    {"ph", "X"},          {"pid", e.pid},
                        {"tid", e.tid},   {"ts", us(e.start_ns)}, {"dur", us(e.dur_ns)}};
    if (!e.args.is_null()) x["args"] = e.args;
    events.push_back(std::move(x));
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

void CallTrace::write(const std::string& path) const {
  const std::filesystem::path file(path);
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) throw Error("step timeline: cannot create the folder of " + path + ": " + ec.message());
  std::ofstream out(file, std::ios::trunc);
  out << to_json().dump() << '\n';
  if (!out.flush()) throw Error("step timeline: cannot write " + path);
}

TraceTrack CallTrace::worker_track(const std::string& worker_name, int rank) {
  const auto cut = worker_name.rfind('_');
  const std::string process = cut == std::string::npos ? worker_name : worker_name.substr(0, cut);
  return {process, process + " rank " + std::to_string(rank)};
}

ThreadTrack::ThreadTrack(TraceTrack track) : track_(std::move(track)), previous_(thread_track), set_(true) {
  thread_track = &track_;
}

ThreadTrack::~ThreadTrack() {
  if (set_) thread_track = previous_;
}

void TraceSpan::begin(std::string_view category, std::string_view name, std::string_view suffix) {
  category_ = category;
  name_.reserve(name.size() + suffix.size());
  name_.append(name).append(suffix);
  start_ = CallTrace::Clock::now();
}

void TraceSpan::finish() {
  trace_->add(std::move(name_), std::move(category_), start_, CallTrace::Clock::now());
  trace_ = nullptr;
}

}  // namespace hyflow::actors
