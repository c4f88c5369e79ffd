#pragma once
// The node side of the cluster (what caf-node runs): an actor system with the middleman and a
// node manager that spawns registered worker types for authenticated controllers.
//
// The node listens with its own front door (cluster/src/front_door.hpp): a peer must prove the
// shared secret (HMAC challenge-response in fixed-size frames) before its connection is handed
// to CAF, over mutual TLS when the node has certificates. So no CAF service or actor of the
// node is reachable without the secret, and a stranger can make the node read at most 72 bytes.
//
// Protocol (untyped node manager actor, reachable only through the front door):
//   ("hf_hello", version, session actor) -> json {session, node}  (version checked)
//   ("hf_spawn", session, worker name)   -> actor (an uninitialized worker, detached)
//   ("hf_port", session)                 -> free TCP port on the node (MASTER_PORT)
// Session ids are random 64-bit numbers; spawn and port need one from hello.

#include <hyflow/cluster/node_info.hpp>
#include <hyflow/cluster/tls.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::cluster {

struct NodeOptions {
  std::string bind = "127.0.0.1";
  int port = 0;        ///< 0: a free port (see NodeServer::port)
  std::string secret;  ///< empty: no authentication (a warning is logged)
  int heartbeat_interval_ms = 500;  ///< 0: off; the same defaults as RuntimeOptions
  int connection_timeout_ms = 3000;
  int scheduler_threads = 0;
  /// Mutual TLS: this node's certificate, its private key and the CA that signed the
  /// controllers' certificates (caf-node's --tls-cert, --tls-key, --tls-ca).
  TlsFiles tls;
  /// The largest CAF (BASP) message a peer may send, even an authenticated one (caf-node
  /// --max-message-mb): a header announcing more closes that connection with a logged error
  /// instead of allocating it. Large DataProtos travel on the data plane, except over TLS.
  uint64_t max_message_bytes = uint64_t{2} << 30;
};

/// A peer connected to the node's middleman (a controller) and how long it has been silent.
struct PeerLiveness {
  std::string peer;                         ///< "host:port" of the connection's far end
  double seconds_since_last_message = 0.0;  ///< BASP heartbeats count as messages
};

class NodeServer {
 public:
  /// Starts and publishes (over TLS when the options name certificates); ValueError for a bad
  /// TLS file set, ClusterError when the port cannot be opened. Installs this process's data
  /// plane as the payload transfer of the workers it hosts.
  explicit NodeServer(NodeOptions options);
  /// Stops accepting, then stops the node manager and every worker it spawned; their
  /// controllers see the workers end with "node host:port: `why`". Idempotent.
  void shutdown(const std::string& why);
  /// shutdown("the node was shut down") unless called before, and waits for the workers.
  ~NodeServer();
  NodeServer(const NodeServer&) = delete;
  NodeServer& operator=(const NodeServer&) = delete;
  int port() const;
  const NodeInfo& info() const;
  /// Connections the front door refused for a proof that does not match the shared secret.
  uint64_t wrong_secret_count() const;
  /// The peers of the middleman's connections, read on its I/O thread (where the BASP broker
  /// keeps each connection's last-message time); empty when that thread does not answer
  /// within `timeout`.
  std::vector<PeerLiveness> peer_liveness(std::chrono::milliseconds timeout) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyflow::cluster
