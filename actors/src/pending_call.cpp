#include <hyflow/actors/detail/pending_call.hpp>

namespace hyflow::actors::detail {

namespace {
thread_local int completing = 0;
}

bool PendingCall::in_completion() { return completing > 0; }

PendingCall::PendingCall(std::string m, std::vector<int> r, std::vector<std::vector<Value>> a, int ws)
    : method(std::move(m)), ranks(std::move(r)), args(std::move(a)), world_size(ws),
      results_(ranks.size()), errors_(ranks.size()), answered_at_(ranks.size()), cleanups_(ranks.size()),
      remaining_(ranks.size()) {}

PendingCall::~PendingCall() {
  for (auto& fns : cleanups_)
    for (auto& fn : fns) fn();
}

void PendingCall::run_cleanups(size_t index, std::unique_lock<std::mutex>& lock) {
  if (cleanups_[index].empty()) return;
  auto fns = std::move(cleanups_[index]);
  cleanups_[index].clear();
  lock.unlock();  // a settled index takes no new cleanups: they run at once
  for (auto& fn : fns) fn();
  lock.lock();
}

bool PendingCall::settled(size_t index) const {
  std::lock_guard lock(mutex_);
  return results_[index] || errors_[index];
}

void PendingCall::on_settled(size_t index, std::function<void()> fn) {
  {
    std::lock_guard lock(mutex_);
    if (!results_[index] && !errors_[index]) {
      cleanups_[index].push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void PendingCall::finish_one_locked(std::unique_lock<std::mutex>& lock) {
  if (--remaining_ > 0) return;
  lock.unlock();
  if (on_complete) {
    ++completing;
    try {
      on_complete(*this);
    } catch (...) {
      --completing;
      on_complete = nullptr;
      throw;
    }
    --completing;
    on_complete = nullptr;  // drops what it captured (the group view)
  }
  // Notify after on_complete so that waiters see its effects.
  std::lock_guard relock(mutex_);
  cv_.notify_all();
}

void PendingCall::deliver(size_t index, Value value) {
  std::unique_lock lock(mutex_);
  if (results_[index] || errors_[index]) return;  // already failed (watchdog, down) or answered
  results_[index] = std::move(value);
  answered_at_[index] = Clock::now();
  run_cleanups(index, lock);
  finish_one_locked(lock);
}

void PendingCall::fail(size_t index, std::exception_ptr error) {
  std::unique_lock lock(mutex_);
  if (results_[index] || errors_[index]) return;
  errors_[index] = std::move(error);
  answered_at_[index] = Clock::now();
  run_cleanups(index, lock);
  finish_one_locked(lock);
}

int PendingCall::index_of(int rank) const {
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == rank) return static_cast<int>(i);
  return -1;
}

bool PendingCall::done() const {
  std::lock_guard lock(mutex_);
  return remaining_ == 0;
}

void PendingCall::wait() const {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [this] { return remaining_ == 0; });
}

std::vector<int> PendingCall::unanswered() const {
  std::lock_guard lock(mutex_);
  std::vector<int> out;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (!results_[i] && !errors_[i]) out.push_back(ranks[i]);
  return out;
}

bool PendingCall::take_deadline_report() {
  std::lock_guard lock(mutex_);
  if (deadline_reported_) return false;
  deadline_reported_ = true;
  return true;
}

std::vector<Value> PendingCall::take_outputs() {
  std::lock_guard lock(mutex_);
  std::exception_ptr first;
  size_t failed = 0;
  for (auto& e : errors_)
    if (e) {
      if (!first) first = e;
      if (e != first || failed == 0) ++failed;  // ranks abandoned with the first error count once
    }
  if (first) {
    if (failed == 1) std::rethrow_exception(first);
    // One exception for the call: the lowest failed rank's, of its own type, counting others.
    try {
      std::rethrow_exception(first);
    } catch (const RuntimeStoppedError&) {
      throw;
    } catch (const CallTimeoutError& e) {
      throw CallTimeoutError(e.method(), e.ranks(), e.what());
    } catch (const WorkerDiedError& e) {
      throw WorkerDiedError(e.method(), e.rank(), e.message(),
                            std::string(e.what()) + " (" + std::to_string(failed - 1) + " more rank(s) failed)");
    } catch (const CallError& e) {
      throw CallError(e.method(), e.rank(), e.message(),
                      std::string(e.what()) + " (" + std::to_string(failed - 1) + " more rank(s) failed)", e.kind());
    }
  }
  std::vector<Value> out;
  out.reserve(results_.size());
  for (auto& r : results_) out.push_back(std::move(*r));
  return out;
}

std::vector<double> PendingCall::answer_us() const {
  std::lock_guard lock(mutex_);
  std::vector<double> out;
  for (auto& t : answered_at_)
    out.push_back(std::chrono::duration<double, std::micro>(t - start).count());
  return out;
}

}  // namespace hyflow::actors::detail
