#pragma once
// The controller side of the cluster: caf-node processes host workers; a RemoteLauncher places
// a WorkerGroup's workers on them, behind the unchanged WorkerGroup API.
//
//   namespace cl = hyflow::cluster;
//   Runtime rt({.network = true});
//   auto nodes = cl::RemoteLauncher::connect(rt, {.nodes = {"10.0.0.1:7000", "10.0.0.2:7000"},
//                                                 .secret = cl::read_secret_file("secret")});
//   rt.set_launcher(nodes);
//   WorkerGroup wg(rt, nodes->pool(4), {"CriticWorker", cfg});   // 4 workers on every node
//
// Ranks are deterministic: nodes sorted by address (host, then port), then local rank; node i
// of a ResourcePool is the i-th node in that order.

#include <hyflow/actors/resource_pool.hpp>
#include <hyflow/actors/runtime.hpp>
#include <hyflow/cluster/node_info.hpp>
#include <hyflow/cluster/tls.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::cluster {

struct ClusterOptions {
  std::vector<std::string> nodes{};  ///< "host:port" of each caf-node
  std::string secret{};            ///< shared secret (empty: only nodes started without one accept)
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds spawn_timeout{10000};
  std::chrono::milliseconds init_timeout{120000};  ///< worker constructors (model loading)
  /// Mutual TLS (config keys cluster.tls_cert, cluster.tls_key, cluster.tls_ca). CAF reads the
  /// files from the actor system's configuration, so the Runtime must have been created with
  /// with_tls() and the same files; connect() checks that (ValueError otherwise).
  TlsFiles tls{};
  /// The largest CAF (BASP) message a node may send this controller: a larger one closes that
  /// node's connection with a logged error instead of being allocated.
  uint64_t max_message_bytes = uint64_t{2} << 30;
};

/// Places workers on caf-node processes. Each node holds a session for this controller; its
/// workers stop when the session (the launcher, or the controller process) goes away.
class RemoteLauncher : public actors::WorkerLauncher {
 public:
  /// Connects to and authenticates with every node. ClusterError naming the node on a closed
  /// port, a silent peer (after connect_timeout), a protocol mismatch or a refused secret.
  /// The runtime needs CAF's middleman: Runtime(RuntimeOptions{.network = true}), or for
  /// Runtime(system) an actor_system_config given Runtime::configure_network (ValueError saying
  /// which otherwise). Installs this process's data plane as the runtime's payload transfer
  /// (hyflow/cluster/data_plane.hpp).
  static std::shared_ptr<RemoteLauncher> connect(Runtime& runtime, ClusterOptions options);
  ~RemoteLauncher() override;

  /// Nodes in rank order (sorted by address).
  const std::vector<NodeInfo>& nodes() const;
  /// This session's job id (128 random bits in hex): the workers it launches store and fetch
  /// their large payloads under job_data_plane_token(cluster token, job id).
  const std::string& job_id() const;
  /// A pool of `workers_per_node` on every node (verl's process_on_nodes).
  ResourcePool pool(int workers_per_node, bool use_gpu = false) const;
  /// A pool from explicit per-node counts; ClusterError when it needs more nodes than there
  /// are, or more GPUs on a node than it advertises (naming the node and the shortfall).
  ResourcePool pool(std::vector<int> process_on_nodes, bool use_gpu = false) const;

  /// Spawns one worker per environment on the node the environment's name places it on
  /// ("..._{node}:{local}"), renames it "...@host:port", points MASTER_ADDR/PORT at the rank-0
  /// node, and constructs it there.
  std::vector<actors::WorkerRef> launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) override;

  struct Impl;

 private:
  explicit RemoteLauncher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyflow::cluster
