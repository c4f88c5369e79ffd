#pragma once
// The cluster: caf-node processes host workers; the controller places a WorkerGroup's workers
// on them through a RemoteLauncher, behind the unchanged WorkerGroup API.
//
//   Runtime rt({.network = true});
//   auto cluster = hyflow::RemoteLauncher::connect(rt, {.nodes = {"10.0.0.1:7000", "10.0.0.2:7000"},
//                                                       .secret = hyflow::read_secret_file("secret")});
//   rt.set_launcher(cluster);
//   WorkerGroup wg(rt, cluster->pool(4), {"CriticWorker", cfg});   // 4 workers on every node
//
// Ranks are deterministic: nodes sorted by address (host, then port), then local rank; node i
// of a ResourcePool is the i-th node in that order.

#include <hyflow/actors/resource_pool.hpp>
#include <hyflow/actors/runtime.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hyflow {

/// Version of the controller <-> node protocol; a mismatch is a ClusterError on connect.
inline constexpr uint32_t kNodeProtocolVersion = 1;

/// Connecting to, authenticating with or placing workers on a node failed. what() names the
/// node ("host:port") and the cause.
class ClusterError : public Error {
 public:
  using Error::Error;
};

/// What a node advertises.
struct NodeInfo {
  std::string address;  ///< "host:port" as the controller reached it
  std::string hostname;
  int cpus = 0;
  int gpus = 0;
  std::vector<std::string> gpu_names;
  std::vector<int64_t> gpu_memory_bytes;
  uint32_t protocol_version = 0;

  Json to_json() const;
  static NodeInfo from_json(const Json& j);
};

/// "host:port,host:port" (the cluster.nodes key) -> addresses; ValueError naming a bad entry.
std::vector<std::string> parse_node_list(const std::string& list);
/// The shared secret in a file (trailing newline stripped); ValueError when missing or empty.
std::string read_secret_file(const std::string& path);
/// HMAC-SHA256(secret, challenge) in hex: the proof a controller sends (the secret itself never
/// crosses the network).
std::string challenge_proof(const std::string& secret, const std::string& challenge);

/// Checks a mutual-TLS file set before CAF's openssl module sees it (CAF aborts a server and
/// hangs a client on a bad path). All three or none: a partial set is a ValueError naming the
/// missing one as `names` spell it (e.g. {"--tls-cert", "--tls-key", "--tls-ca"}); each file
/// must be readable PEM of its kind (certificate, private key, CA certificate) and the key must
/// belong to the certificate, else a ValueError naming the file. True when TLS is on.
bool check_tls_files(const std::string& cert, const std::string& key, const std::string& ca,
                     const std::vector<std::string>& names = {"tls_cert", "tls_key", "tls_ca"});

struct ClusterOptions {
  std::vector<std::string> nodes;  ///< "host:port" of each caf-node
  std::string secret;              ///< shared secret (empty: only nodes started without one accept)
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds spawn_timeout{10000};
  std::chrono::milliseconds init_timeout{120000};  ///< worker constructors (model loading)
  /// Mutual TLS (CAF's openssl module): PEM files of this controller's certificate, its private
  /// key and the CA that signed the nodes' certificates; all three or none (config keys
  /// cluster.tls_cert, cluster.tls_key, cluster.tls_ca). CAF reads them from the actor system's
  /// configuration, so the Runtime must have been created with the openssl module and the same
  /// three files; RemoteLauncher::connect checks that (ValueError otherwise).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
};

/// Places workers on caf-node processes. Each node holds a session for this controller; its
/// workers stop when the session (the launcher, or the controller process) goes away.
class RemoteLauncher : public WorkerLauncher {
 public:
  /// Connects to and authenticates with every node. ClusterError naming the node on a closed
  /// port, a silent peer (after connect_timeout), a protocol mismatch or a refused secret.
  /// The runtime must be created with RuntimeOptions::network.
  static std::shared_ptr<RemoteLauncher> connect(Runtime& runtime, ClusterOptions options);
  ~RemoteLauncher() override;

  /// Nodes in rank order (sorted by address).
  const std::vector<NodeInfo>& nodes() const;
  /// A pool of `workers_per_node` on every node (verl's process_on_nodes).
  ResourcePool pool(int workers_per_node, bool use_gpu = false) const;
  /// A pool from explicit per-node counts; ClusterError when it needs more nodes than there
  /// are, or more GPUs on a node than it advertises (naming the node and the shortfall).
  ResourcePool pool(std::vector<int> process_on_nodes, bool use_gpu = false) const;

  /// Spawns one worker per environment on the node the environment's name places it on
  /// ("..._{node}:{local}"), renames it "...@host:port", points MASTER_ADDR/PORT at the rank-0
  /// node, and constructs it there.
  std::vector<WorkerRef> launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) override;

  struct Impl;

 private:
  explicit RemoteLauncher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The node side (what caf-node runs): an actor system with the middleman and a published
/// node manager that spawns registered worker types for authenticated controllers.
struct NodeOptions {
  std::string bind = "127.0.0.1";
  int port = 0;        ///< 0: a free port (see NodeServer::port)
  std::string secret;  ///< empty: no authentication (a warning is logged)
  int heartbeat_interval_ms = 0;
  int connection_timeout_ms = 0;
  int scheduler_threads = 0;
  /// Mutual TLS: this node's certificate, its private key and the CA that signed the
  /// controllers' certificates (PEM); all three or none (check_tls_files).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
};

class NodeServer {
 public:
  /// Starts and publishes (over TLS when the options name certificates); ValueError for a bad
  /// TLS file set, ClusterError when the port cannot be opened.
  explicit NodeServer(NodeOptions options);
  /// Stops the node manager and every worker it spawned.
  ~NodeServer();
  NodeServer(const NodeServer&) = delete;
  NodeServer& operator=(const NodeServer&) = delete;
  int port() const;
  const NodeInfo& info() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// One log line to stderr: "2026-11-22T07:10:00.123Z [caf-node] text".
void cluster_log(const std::string& text);

}  // namespace hyflow
