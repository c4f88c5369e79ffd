#pragma once
// WorkerHost: what the roles hosted by one worker share. The runtime creates one per worker
// (per CAF worker actor) and owns it; every Worker constructed for that worker, each role of a
// colocated WorkerDict included, holds the same host. Modules above actors keep their
// per-worker resources here, created on first use: the process group of the worker group
// (hyflow/parallel), so that colocated roles share one rendezvous and one set of sockets.

#include <map>
#include <memory>
#include <mutex>
#include <typeindex>

namespace hyflow::actors {

class WorkerHost {
 public:
  /// The resource of type T, made by `make()` (returning std::shared_ptr<T>) on first use.
  /// Creation runs under the host's lock, so a blocking constructor (a rendezvous) happens
  /// once; the roles of one worker are constructed on one thread.
  template <class T, class Make>
  std::shared_ptr<T> get_or_create(Make&& make) {
    std::lock_guard lock(mutex_);
    auto& slot = resources_[std::type_index(typeid(T))];
    if (!slot) slot = std::shared_ptr<T>(make());
    return std::static_pointer_cast<T>(slot);
  }
  /// The resource of type T if it was created.
  template <class T>
  std::shared_ptr<T> find() const {
    std::lock_guard lock(mutex_);
    auto it = resources_.find(std::type_index(typeid(T)));
    return it == resources_.end() ? nullptr : std::static_pointer_cast<T>(it->second);
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::type_index, std::shared_ptr<void>> resources_;
};

}  // namespace hyflow::actors
