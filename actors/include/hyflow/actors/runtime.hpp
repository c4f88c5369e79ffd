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
struct OwnedSystem;
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
  std::function<void(caf::actor_system_config&)> configure_system{};
};

/// The runtime of one controller: where its workers and groups live.
///
/// Two ways to get one. `Runtime()` (the embedded default) starts a private CAF actor system;
/// `Runtime(system)` runs on the caller's own actor system, whose config must have had
/// `Runtime::register_types(cfg)` (the one thing an embedding application adds).
///
/// Shutdown is defined by the Runtime alone: ~Runtime stops every group it made (calls still
/// in flight fail with RuntimeStoppedError), stops the workers it launched and waits for those
/// in this process (a worker in a long method is waited for), releases its launchers and every
/// actor handle, and, when it owns the actor system, destroys that system on its own thread.
/// Group handles and futures may outlive it: their calls then fail with RuntimeStoppedError;
/// holding or destroying them never keeps an actor system alive nor tears one down.
/// Destroy a Runtime before main returns (a local, or a unique_ptr reset at the end), and a
/// Runtime on the caller's system before that system.
class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = {});
  /// On the caller's actor system (not owned). ValueError when its config lacks
  /// register_types. RuntimeOptions do not apply: threads, networking and TLS are the
  /// caller's config (RuntimeConfig in src/runtime.cpp shows what hyflow sets for its own).
  explicit Runtime(caf::actor_system& system);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Adds what hyflow needs to a CAF config: the DataProto and Value message types and the
  /// "hyflow" error category. Call it on every node's config (same as
  /// caf_protocol::register_types).
  static void register_types(caf::actor_system_config& cfg);
  /// Adds what a controller of caf-nodes needs to a CAF config, the settings
  /// Runtime({.network = true}) gives its own system: loads caf::io::middleman, sets
  /// "scheduler.policy" to caf::atom("sharing") (remote replies wake a thread at once) and, when
  /// > 0, "middleman.heartbeat-interval" and "middleman.connection-timeout" (caf::timespan),
  /// which must match the caf-nodes' --heartbeat-ms and --connection-timeout-ms. For
  /// Runtime(system): call it in the application's config constructor (docs/embedding.md).
  static void configure_network(caf::actor_system_config& cfg, int heartbeat_interval_ms = 500,
                                int connection_timeout_ms = 3000);
  /// True for the private actor system of Runtime(RuntimeOptions).
  bool owns_system() const;

  /// The launcher new groups use unless their WorkerGroupOptions name one (in-process by
  /// default).
  WorkerLauncher& launcher();
  /// Replaces the default launcher for groups created from now on (existing groups keep
  /// theirs). To place one group elsewhere, prefer WorkerGroupOptions::launcher.
  void set_launcher(std::shared_ptr<WorkerLauncher> launcher);
  /// A new in-process launcher of this runtime (detached worker actors in this process), e.g.
  /// to put one group back in-process after set_launcher installed a remote one.
  std::shared_ptr<WorkerLauncher> in_process_launcher();

  /// Keeps `workers` reachable by name after their group is gone (verl's detached actors).
  void keep_detached(const std::vector<WorkerRef>& workers);
  /// A detached worker by name; KeyError listing the known names.
  WorkerRef find_detached(const std::string& name) const;

  /// Builds the transport for a group of workers; with owns_workers the workers stop when the
  /// last user of the transport is gone (or the Runtime stops).
  std::shared_ptr<detail::Transport> connect(std::vector<WorkerRef> workers, bool owns_workers);

 private:
  friend caf::actor_system& caf_protocol::system_of(Runtime& runtime);
  std::unique_ptr<detail::OwnedSystem> owned_;  ///< the private system, when there is one
  std::shared_ptr<detail::RuntimeCore> core_;
};

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
using actors::Runtime;
using actors::RuntimeOptions;
}  // namespace hyflow
