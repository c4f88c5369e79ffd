#pragma once
// Runtime: the actor system that hosts workers, and the seam where they are placed. The
// embedded default places every worker in this process (a detached CAF actor, one thread
// each); the cluster layer installs a launcher that spawns them on remote nodes.

#include <hyflow/actors/worker.hpp>
#include <hyflow/actors/worker_registry.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace caf {
class actor_system;
class actor_system_config;
}

namespace hyflow::actors {

class Runtime;
namespace caf_protocol {
caf::actor_system& system_of(Runtime& runtime);
}

/// One launched worker, opaque to the call pipeline (a CAF actor handle inside).
class WorkerHandle {
 public:
  virtual ~WorkerHandle() = default;
  virtual const WorkerEnv& env() const = 0;
  virtual const WorkerSpec& spec() const = 0;
};
using WorkerRef = std::shared_ptr<WorkerHandle>;

/// Creates and initializes one worker per environment (ranks in order). A constructor that
/// throws becomes a CallError naming the rank and the message; no worker is left running.
class WorkerLauncher {
 public:
  virtual ~WorkerLauncher() = default;
  virtual std::vector<WorkerRef> launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) = 0;
};

namespace detail {
struct PendingCall;
/// Carries calls to a set of workers, watches them (monitors, deadlines).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual const std::vector<WorkerRef>& workers() const = 0;
  virtual void submit(std::shared_ptr<PendingCall> call) = 0;
  /// Terminates the worker of `rank` (its pending and later calls fail naming it).
  virtual void kill(int rank) = 0;
  virtual bool alive(int rank) const = 0;
};
class RuntimeCore;
}  // namespace detail

struct RuntimeOptions {
  /// CAF scheduler threads for event-based actors (0: CAF's default). Workers are detached
  /// and do not use them.
  int scheduler_threads = 0;
  /// Load CAF's middleman (networking), needed to place workers on caf-node processes
  /// (hyflow/cluster/remote_launcher.hpp).
  bool network = false;
  /// Middleman heartbeats (0: off), on by default for networked runtimes. Both ends must
  /// agree: a node without heartbeats drops an idle link after the other's connection timeout
  /// (caf-node's --heartbeat-ms and --connection-timeout-ms have the same defaults). With them,
  /// a hung node (SIGSTOP, a cut network) is noticed after connection_timeout_ms, which must
  /// exceed the longest single CAF message transfer (large DataProtos use the data plane).
  int heartbeat_interval_ms = 500;
  int connection_timeout_ms = 3000;
  /// Further configuration of the actor system before it starts, run last (after the
  /// middleman is loaded when `network` is set). The cluster module's mutual TLS is set this
  /// way (hyflow::cluster::with_tls in hyflow/cluster/tls.hpp), so that this module links
  /// neither OpenSSL nor CAF's openssl module.
  std::function<void(caf::actor_system_config&)> configure_system;
};

/// Destroy a Runtime before main returns (a local, or a unique_ptr reset at the end): CAF's
/// actor system must not be torn down from static destructors.
class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = {});
  /// Stops every worker this runtime started (after their running method returns).
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// The launcher new groups use (in-process by default).
  WorkerLauncher& launcher();
  void set_launcher(std::shared_ptr<WorkerLauncher> launcher);

  /// Keeps `workers` reachable by name after their group is gone (verl's detached actors).
  void keep_detached(const std::vector<WorkerRef>& workers);
  /// A detached worker by name; KeyError listing the known names.
  WorkerRef find_detached(const std::string& name) const;

  /// Builds the transport for a group of workers; with owns_workers the workers stop when the
  /// last user of the transport is gone.
  std::shared_ptr<detail::Transport> connect(std::vector<WorkerRef> workers, bool owns_workers);

 private:
  friend caf::actor_system& caf_protocol::system_of(Runtime& runtime);
  std::shared_ptr<detail::RuntimeCore> core_;
};

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
using actors::Runtime;
using actors::RuntimeOptions;
}  // namespace hyflow
