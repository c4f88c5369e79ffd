#pragma once
// Server: GET /metrics over HTTP/1.1 (Connection: close) on its own thread, serving a
// Registry's exposition. Loopback by default; any other address needs a token, and then every
// request must carry "Authorization: Bearer <token>" (401 otherwise). Bounded: the request
// head (max_head_bytes, else 431), one deadline per connection (a slow client costs only its
// own connection), max_connections at once (503 beyond). 404 for another path, 405 for another
// method, 400 for a malformed request line.

#include <hyflow/metrics/registry.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace hyflow::metrics {

struct ServerOptions {
  std::string bind = "127.0.0.1";                       ///< an IPv4 or IPv6 address, or a host name
  int port = 0;                                         ///< 0: a free port (Server::port)
  std::string token;                                    ///< required unless `bind` is a loopback address
  std::chrono::milliseconds connection_deadline{5000};  ///< from accept to the last byte written
  size_t max_connections = 8;                           ///< served at once
  size_t max_head_bytes = 8192;                         ///< request line and headers
};

/// True for 127.0.0.0/8, ::1 and names that resolve only to those (localhost).
bool is_loopback(const std::string& bind);

/// The token in `path`: its contents without surrounding whitespace. ValueError naming the
/// file when it cannot be read or is empty.
std::string read_token_file(const std::string& path);

class Server {
 public:
  /// Binds and starts serving `registry` (which must outlive the server). ValueError for a
  /// non-loopback bind without a token or a port out of range; hyflow::Error when the address
  /// cannot be bound.
  Server(const Registry& registry, ServerOptions options);
  /// Stops accepting and waits for the connections in progress (each within its deadline).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  /// The port listened on (the chosen one for port 0).
  int port() const;
  /// "bind:port" ("[addr]:port" for IPv6).
  std::string address() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Equal strings, in time that depends only on their lengths.
bool equal_in_constant_time(const std::string& a, const std::string& b);

}  // namespace hyflow::metrics
