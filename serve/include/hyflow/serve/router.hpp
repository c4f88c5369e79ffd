#pragma once
// Router: one OpenAI-compatible HTTP front over several serve::Server replicas (cpp-httplib on
// both sides). A completion request goes to the replica with the fewest requests in flight,
// except that a session (X-Session-Id, else the body's `user`) stays on the replica it started
// on (an affinity map of bounded size, least recently used dropped first), so one conversation
// reuses that replica's prefix and its recorded trajectory. Streaming responses are forwarded
// chunk by chunk; a client that leaves closes the upstream connection, which frees the slot on
// the replica. GET /health and GET /v1/models aggregate the replicas. Same limits and bearer-token
// rules as the server: loopback by default, a token required elsewhere, bounded body and
// requests in flight. A replica that cannot be reached answers 503 naming it.
// Guide: docs/rollout-server.md ("Several replicas: the router").

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::serve {

struct RouterOptions {
  /// Base URLs of the replicas ("http://127.0.0.1:8001/v1"; "/v1" and a trailing "/" optional).
  std::vector<std::string> replicas;
  std::string host = "127.0.0.1";           ///< loopback by default; any other address needs `token`
  int port = 0;                             ///< 0: a free port (Router::port)
  std::string token;                        ///< bearer token every client request must carry (empty: none)
  std::string replica_token;                ///< bearer token sent to the replicas (empty: none)
  size_t max_body_bytes = size_t{1} << 20;  ///< larger bodies: 413
  int64_t max_in_flight = 256;              ///< requests being forwarded; beyond: 429 with Retry-After
  size_t max_sessions = 4096;               ///< affinity entries; beyond: the least recently used is dropped
  size_t max_session_id_bytes = 128;        ///< longer session ids: 400
  int threads = 0;                          ///< HTTP threads; 0: max_in_flight + 8
  int connect_timeout_s = 5;                ///< to a replica
  int read_timeout_s = 600;                 ///< a replica's silence before the request fails (503)
  int retry_after_s = 1;
};

/// What the router did with one replica.
struct ReplicaStats {
  std::string url;        ///< as given
  int64_t in_flight = 0;  ///< requests being forwarded now
  int64_t requests = 0;   ///< forwarded so far
  int64_t failures = 0;   ///< of those, the replica could not be reached or broke off
};

class Router {
 public:
  /// Binds and serves on its own thread. ValueError for no replicas, a replica URL that is not
  /// "http://host:port[/v1]", or a non-loopback host without a token; hyflow::Error when the
  /// address cannot be bound.
  explicit Router(RouterOptions options);
  /// Stops accepting, finishes the requests in progress and joins.
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  int port() const;
  /// "http://host:port/v1", what an OpenAI client takes as base_url.
  std::string base_url() const;
  std::vector<ReplicaStats> replicas() const;
  /// The replica index a session is pinned to; nullopt when the router does not know it.
  std::optional<size_t> session_replica(const std::string& session_id) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyflow::serve
