#pragma once
// What serve::Server and serve::Router do alike with their cpp-httplib server: the worker pool,
// limits and timeouts, binding with a real backlog, and the base URL (internal to hyflow::serve).

#include "bounded_pool.hpp"

#include <hyflow/core/error.hpp>

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <memory>
#include <string>

namespace hyflow::serve::detail {

// cpp-httplib 0.11 listens with a backlog of 5 (compiled into Debian's library): a burst of
// clients connecting at once (32 agents starting a turn) overflows it and the dropped SYNs come
// back only after the client's 1 s retransmission timeout. A second listen() raises it.
constexpr int kListenBacklog = 1024;

/// `threads` workers with a bounded queue (BoundedPool), bodies up to `max_body_bytes`, keep-alive,
/// 10 s read and write timeouts.
inline void configure_front(httplib::Server& http, size_t threads, size_t max_body_bytes) {
  http.new_task_queue = [threads] { return new BoundedPool(threads, threads); };
  http.set_payload_max_length(max_body_bytes);
  http.set_keep_alive_max_count(1000);
  http.set_keep_alive_timeout(10);
  http.set_read_timeout(10);
  http.set_write_timeout(10);
}

/// Binds host:port (0: a free port) with a backlog of kListenBacklog and returns the port.
/// Accepted sockets inherit TCP_NODELAY: a server-sent event is written as soon as it is made, not
/// held back by Nagle's algorithm until the previous one is acknowledged. Error
/// "<what>: cannot bind host:port".
inline int bind_front(httplib::Server& http, const std::string& host, int port, const std::string& what) {
  auto listen_socket = std::make_shared<socket_t>(INVALID_SOCKET);
  http.set_socket_options([listen_socket](socket_t sock) {
    httplib::default_socket_options(sock);
    const int on = 1;
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    *listen_socket = sock;
  });
  const int bound = port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) throw Error(what + ": cannot bind " + host + ":" + std::to_string(port));
  if (*listen_socket != INVALID_SOCKET) ::listen(*listen_socket, kListenBacklog);
  return bound;
}

/// "http://host:port/v1" (an IPv6 host in brackets), what an OpenAI client takes as base_url.
inline std::string base_url_of(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) + "/v1";
}

}  // namespace hyflow::serve::detail
