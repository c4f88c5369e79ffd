#pragma once
// The rendezvous store of the process groups: a key-value server in rank 0's process and one
// client per connection, over TCP. c10d's TCPStore (LibTorch 1.13) listens on every interface
// and serves anyone; this one listens on the configured address only and serves a connection
// only after it proved the group's token: the server sends a 32-byte nonce, the client answers
// HMAC-SHA256(token, "hyflow.store.v1" + nonce). Before that nothing is allocated beyond the
// 32-byte proof, and a connection that does not prove in time (handshake_timeout) is closed;
// when max_handshakes are in progress the oldest one is closed for a newcomer. Every length
// field is bounded (keys, values, keys per request), authenticated or not: a malformed or
// oversized request costs its connection, never the store. Needs neither torch nor CUDA.
//
// Wire (after the handshake), integers big-endian: a request is op (1 byte), count (4 bytes) and
// `count` strings, each a 4-byte length and its bytes; an answer is a status (1 byte: 0 ok,
// 1 missing/timed out) with strings in the same form.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::parallel {

/// Bounds on what one store request may carry (both ends check them).
struct StoreLimits {
  size_t max_key_bytes = 4096;
  size_t max_value_bytes = size_t{16} << 20;
  size_t max_keys_per_request = 1024;
};

struct RendezvousServerOptions {
  /// The address the server listens on (IPv4 or a host name resolving to one), never "all".
  std::string address = "127.0.0.1";
  /// 0: a free port (RendezvousServer::port() says which).
  int port = 0;
  /// The group's secret every connection proves before it is served.
  std::string token;
  /// The whole handshake (connect to proof) of one connection.
  std::chrono::milliseconds handshake_timeout{3000};
  /// One request of an authenticated connection, from its first byte to its last; and an
  /// answer the peer does not read.
  std::chrono::milliseconds request_timeout{30000};
  /// Handshakes in progress; a new connection beyond it closes the oldest one.
  size_t max_handshakes = 64;
  /// Authenticated connections; a new connection beyond it is closed.
  size_t max_connections = 1024;
  StoreLimits limits;
};

/// The store's server: binds and listens in the constructor (hyflow::Error naming the address
/// and port when it cannot), serves from a thread of its own until destroyed.
class RendezvousServer {
 public:
  explicit RendezvousServer(RendezvousServerOptions options);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const;
  /// Connections closed because they failed or did not finish the handshake in time, or sent a
  /// malformed, oversized or late request (for tests and logs).
  uint64_t rejected_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct RendezvousClientOptions {
  std::string address = "127.0.0.1";
  int port = 0;
  std::string token;
  /// How long the constructor retries a server that does not listen yet, and the bound on
  /// every operation but wait (whose bound is its own timeout, plus this).
  std::chrono::milliseconds timeout{30000};
  StoreLimits limits;
};

/// One authenticated connection to a RendezvousServer. Thread-safe (one request at a time).
/// Errors are hyflow::Error naming the store's address and the operation; after one the next
/// operation reconnects.
class RendezvousClient {
 public:
  /// Connects and proves the token; hyflow::Error when the server stays unreachable for
  /// `timeout` or refuses the proof (a different token).
  explicit RendezvousClient(RendezvousClientOptions options);
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value);
  /// The value when the key is present now.
  std::optional<std::vector<uint8_t>> get(const std::string& key);
  /// Waits until every key exists; false when `timeout` passed first.
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Adds `delta` to the integer at `key` (0 when absent; stored as decimal text, as c10d does).
  int64_t add(const std::string& key, int64_t delta);
  bool check(const std::vector<std::string>& keys);
  /// Whether the key existed.
  bool erase(const std::string& key);
  int64_t num_keys();
  /// c10d's compareSet: sets `desired` when the value is `expected` (or the key is absent and
  /// `expected` empty); returns the value now stored.
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired);
  /// "address:port", for messages.
  const std::string& where() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyflow::parallel
