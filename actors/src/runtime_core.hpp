#pragma once
// Internal to the actors module: what a Runtime shares with its groups and launchers
// (runtime.cpp): the pointer to its actor system, the handles and local actors it must stop,
// and the launcher groups use by default.

#include "worker_actor.hpp"

#include <hyflow/actors/runtime.hpp>

#include <caf/abstract_actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/actor_system.hpp>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hyflow::actors::detail {

/// Counts the runtime's local actors (collectors, in-process workers) that have not
/// terminated, so that stopping can wait for them on a thread that is not theirs.
class LiveActors : public std::enable_shared_from_this<LiveActors> {
 public:
  void track(caf::abstract_actor* actor) {
    {
      std::lock_guard lock(mutex_);
      ++running_;
    }
    actor->attach_functor([self = shared_from_this()] { self->ended(); });
  }
  void wait_all_ended() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return running_ == 0; });
  }

 private:
  void ended() {
    std::lock_guard lock(mutex_);
    if (--running_ == 0) cv_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  size_t running_ = 0;
};

class CafTransport;

/// What a Runtime shares with its groups: never the actor system itself, only a pointer to it
/// that stop() clears. Groups, futures and worker handles may outlive the Runtime; the system
/// is torn down (when the Runtime owns it) by ~Runtime on the thread that destroys it.
class RuntimeCore {
 public:
  explicit RuntimeCore(caf::actor_system& sys) : system_(&sys) {}
  /// The actor system; RuntimeStoppedError (naming `what`) once stopped.
  caf::actor_system& system(const std::string& what) {
    std::lock_guard lock(mutex);
    if (!system_) throw RuntimeStoppedError(what);
    return *system_;
  }
  /// Stops every group (their pending calls fail with RuntimeStoppedError), every worker it
  /// launched in this process, and releases every handle and launcher; returns once this
  /// process's workers and collectors have terminated. Idempotent.
  void stop();

  std::mutex mutex;
  std::vector<std::weak_ptr<CafTransport>> transports;
  std::vector<std::weak_ptr<CafWorkerHandle>> handles;
  std::vector<caf::actor_addr> launched;
  std::map<std::string, WorkerRef> detached;
  std::shared_ptr<WorkerLauncher> launcher;
  /// Outlives this core: attached functors of late-ending actors still reach it.
  std::shared_ptr<LiveActors> live = std::make_shared<LiveActors>();

  void remember(const std::vector<WorkerRef>& workers) {
    std::lock_guard lock(mutex);
    for (const auto& w : workers)
      if (auto h = std::dynamic_pointer_cast<CafWorkerHandle>(w)) handles.push_back(h);
  }

 private:
  caf::actor_system* system_;
};

}  // namespace hyflow::actors::detail
