#pragma once
// Worker: the base of every class whose methods the controller calls through a WorkerGroup.
// It knows its place in the group (rank, world size, local rank, master address/port,
// device), the dp rank and collect flag per named mesh, and the WorkerHost it shares with the
// other roles of its worker.

#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker_host.hpp>

#include <map>
#include <memory>
#include <string>

namespace hyflow::actors {

/// What a worker learns from the runtime (verl's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
/// MASTER_PORT environment).
struct WorkerEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string device = "cpu";
  /// "{prefix}{type}_{node}:{local_rank}", unique within the runtime.
  std::string name;
  /// The secret of the group's rendezvous store (ProcessGroupOptions::store_token), drawn at
  /// random for each worker group; it travels to remote workers over the authenticated link.
  std::string store_token;
  /// "host:port" of the caf-node hosting the worker (empty in process), for failures that name it.
  std::string node;

  Json to_json() const;
  static WorkerEnv from_json(const Json& j);
};

namespace detail {
/// Thrown by Worker::exit_worker; deliberately not a std::exception, so that user code
/// catching std::exception does not swallow it.
struct WorkerExit {
  std::string reason;
};

/// The runtime sets the environment and the host on the worker's thread before constructing
/// it, so that constructors can already use rank() and friends (as verl workers read env
/// vars), and every role constructed in the scope shares `host`.
class WorkerEnvScope {
 public:
  WorkerEnvScope(const WorkerEnv& env, std::shared_ptr<WorkerHost> host);
  ~WorkerEnvScope();
  WorkerEnvScope(const WorkerEnvScope&) = delete;
  WorkerEnvScope& operator=(const WorkerEnvScope&) = delete;

 private:
  const WorkerEnv* previous_env_;
  std::shared_ptr<WorkerHost> previous_host_;
};
}  // namespace detail

class Worker {
 public:
  /// Takes the environment and host the runtime set up for this thread; outside a runtime a
  /// default single-rank environment (rank 0 of 1 on cpu) and a host of its own.
  Worker();
  explicit Worker(WorkerEnv env, std::shared_ptr<WorkerHost> host = nullptr);
  virtual ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int local_rank() const { return env_.local_rank; }
  const std::string& master_addr() const { return env_.master_addr; }
  int master_port() const { return env_.master_port; }
  const std::string& device() const { return env_.device; }
  const WorkerEnv& env() const { return env_; }

  /// verl's _register_dispatch_collect_info; ValueError when the mesh is registered twice.
  void register_dispatch_collect_info(const std::string& mesh, int64_t dp_rank, bool is_collect);
  /// dp rank of this worker in `mesh`; KeyError naming the mesh if it was never registered.
  int64_t query_dispatch_info(const std::string& mesh) const;
  bool query_collect_info(const std::string& mesh) const;
  /// The environment as JSON (built-in method "worker_env").
  Json worker_env() const { return env_.to_json(); }

  /// What this worker shares with the other roles hosted by the same worker (resources such
  /// as the process group: hyflow::parallel::process_group_of).
  WorkerHost& host() const { return *host_; }

  /// Ends this worker now, as a crash would: the running call gets no answer, the worker
  /// stops and its group fails the call naming this rank. (Fault handling and its tests.)
  [[noreturn]] void exit_worker(const std::string& reason);

  /// Built-in method "execute_with_func_generator" (DP_COMPUTE_PROTO_WITH_FUNC): runs the
  /// worker function registered under `function` on this rank's chunk.
  DataProto execute_with_func_generator(const std::string& function, DataProto data);

 private:
  struct MeshInfo {
    int64_t dp_rank;
    bool is_collect;
  };
  WorkerEnv env_;
  std::map<std::string, MeshInfo> meshes_;
  std::shared_ptr<WorkerHost> host_;
};

/// A function that DP_COMPUTE_PROTO_WITH_FUNC calls on each rank's chunk, by name (names
/// travel on the wire, function objects do not).
using WorkerFunction = std::function<DataProto(Worker&, DataProto)>;
void register_worker_function(const std::string& name, WorkerFunction fn);

template <class W>
void add_builtin_methods(MethodTable<W>& t) {
  t.add("query_dispatch_info", &Worker::query_dispatch_info, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("query_collect_info", &Worker::query_collect_info, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("worker_env", &Worker::worker_env, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("execute_with_func_generator", &Worker::execute_with_func_generator,
        {.dispatch = Dispatch::DP_COMPUTE_PROTO_WITH_FUNC});
}

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
using actors::register_worker_function;
using actors::Worker;
using actors::WorkerEnv;
}  // namespace hyflow
