#pragma once
// Internal to the actors module: the worker actor as the other CAF translation units of the
// runtime see it: the WorkerHandle of a worker actor, and the helpers of the "hyflow" error
// category that the worker, the collector and the group actor share.

#include <hyflow/actors/caf_protocol.hpp>

#include <caf/actor_system.hpp>
#include <caf/error.hpp>

#include <exception>
#include <mutex>
#include <string>

namespace hyflow::actors::detail {

/// A worker actor (local, or a proxy of a remote one) for the call pipeline. The Runtime
/// releases the actor when it stops, so that no handle of its actor system outlives it.
class CafWorkerHandle : public WorkerHandle {
 public:
  CafWorkerHandle(caf_protocol::worker_actor a, WorkerSpec s, WorkerEnv e, std::string job)
      : actor_(std::move(a)), spec_(std::move(s)), env_(std::move(e)), job_(std::move(job)) {}
  const WorkerEnv& env() const override { return env_; }
  const WorkerSpec& spec() const override { return spec_; }
  /// Null once released.
  caf_protocol::worker_actor actor() const {
    std::lock_guard lock(mutex_);
    return actor_;
  }
  void release() {
    std::lock_guard lock(mutex_);
    actor_ = nullptr;
  }
  /// The job (controller session) its remote launcher started it for; empty: none.
  const std::string& job() const { return job_; }

 private:
  mutable std::mutex mutex_;
  caf_protocol::worker_actor actor_;
  WorkerSpec spec_;
  WorkerEnv env_;
  std::string job_;
};

/// The class of an exception, for messages ("ValueError: ...", "std::runtime_error: ..."): the
/// unqualified name of a hyflow error's dynamic type (DataPlaneError, ClusterError, ... from
/// modules above this one included), the full demangled name of any other exception.
std::string kind_of(const std::exception& e);

/// Whether this process's CAF connections are TLS (the data plane is not encrypted).
bool uses_tls(caf::actor_system& sys);

/// Element i of an error's context when it is a string ("hyflow" errors: kind, message), else
/// empty.
std::string context_string(const caf::error& e, size_t i);

}  // namespace hyflow::actors::detail
