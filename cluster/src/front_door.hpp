#pragma once
// Internal to the cluster module: the node's front door. A caf-node never exposes CAF's own
// network protocol (BASP) to a peer that has not proven the shared secret: its listening socket
// belongs to the front door, which runs a fixed-size challenge-response first and only then
// hands the connection to CAF's BASP broker. Before that, a peer can do nothing but the
// handshake below; nothing it sends is parsed as CAF data, and no length it sends is trusted.
//
// Handshake (every frame has a fixed size; integers big-endian):
//   node   -> peer: "HFND" | u32 protocol version | u8 flags (1: secret required, 2: TLS) | 32-byte nonce N
//   peer   -> node: "HFCT" | u32 protocol version | 32-byte nonce C | 32-byte proof P
//   node   -> peer: u8 status (0 ok, 1 version mismatch, 2 wrong secret, 3 door full: evicted,
//                    4 handshake timed out) | 32-byte proof Q
//   P = HMAC-SHA256(secret, "hyflow-node-client" | N | C), Q = HMAC-SHA256(secret, "hyflow-node-server" | C | N)
// (P and Q are zero bytes when the node has no secret.) Q proves to the controller that the node
// knows the secret too. After status 0 both sides speak BASP on the same TCP connection, inside
// a mutual TLS session first when the node has certificates (tls_scribe.hpp).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace hyflow::cluster::detail {

struct FrontDoorOptions {
  std::string bind = "127.0.0.1";
  int port = 0;        ///< 0: a free port
  std::string secret;  ///< empty: every peer that speaks the handshake is admitted
  bool tls = false;    ///< announced in the greeting: CAF's connection will be TLS
  /// A peer must complete the whole handshake within this time from its connect, however
  /// many bytes it trickles (status 4, then closed).
  std::chrono::milliseconds handshake_timeout{5000};
  /// Handshakes in progress at once, in all and from one IP address. A new connection is never
  /// refused for want of room: it evicts the oldest unfinished handshake of its own address
  /// when that address holds max_pending_per_peer, else, when all max_pending are taken, the
  /// oldest of the address that holds the most (status 3, then closed). So a newcomer always
  /// gets its turn, and a flooding address evicts its own connections before anyone else's.
  size_t max_pending = 128;
  size_t max_pending_per_peer = 32;
  /// Log lines about peers (wrong secret, another version, evictions, timeouts): the first
  /// per kind and address in each window, then a summary with the count (peer_log.hpp).
  std::chrono::milliseconds log_window{10000};
};

struct FrontDoorStats {
  uint64_t accepted = 0;       ///< TCP connections accepted
  uint64_t admitted = 0;       ///< handed to CAF after a good handshake
  uint64_t refused = 0;        ///< wrong secret, wrong version or malformed hello
  uint64_t wrong_secret = 0;   ///< of those refused: a proof that does not match the shared secret
  uint64_t timed_out = 0;      ///< no complete hello within handshake_timeout
  uint64_t evicted = 0;        ///< unfinished handshakes closed to make room for a newer connection
};

/// The listening socket and one thread that runs the handshakes (poll; non-blocking sockets).
/// CAF's I/O thread, which serves the authenticated peers, never sees a handshake.
class FrontDoor {
 public:
  /// Binds and starts; `admit` receives each authenticated socket (its owner from then on).
  /// ClusterError when the address cannot be bound.
  FrontDoor(FrontDoorOptions options, std::function<void(int fd)> admit);
  /// Stops accepting and closes every connection still in the handshake.
  ~FrontDoor();
  FrontDoor(const FrontDoor&) = delete;
  FrontDoor& operator=(const FrontDoor&) = delete;
  int port() const;
  FrontDoorStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// The controller's side: connects to host:port, proves the secret and checks the node's proof,
/// all within `timeout`. Returns the connected socket, ready for BASP. A node whose door is full
/// (it evicted this handshake, closed the connection before its greeting or during the
/// handshake, or timed it out) is tried again, with backoff from 10 ms to 250 ms, until
/// `timeout`. ClusterError naming "host:port" and the cause (refused connection, silent peer,
/// door full, not a caf-node, version mismatch, TLS on one side only, secret required but none
/// given, wrong secret, node without the secret). `tls`: this controller will speak TLS after
/// the handshake.
int front_door_connect(const std::string& host, int port, const std::string& secret, bool tls,
                       std::chrono::milliseconds timeout);

}  // namespace hyflow::cluster::detail
