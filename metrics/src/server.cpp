// Server: GET /metrics on POSIX sockets. One acceptor thread (poll on the listener and a wake
// pipe) and one short-lived thread per connection, at most max_connections of them; every
// read and write of a connection waits at most until its deadline.
#include <hyflow/core/error.hpp>
#include <hyflow/core/text.hpp>
#include <hyflow/metrics/server.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace hyflow::metrics {
namespace {

using Clock = std::chrono::steady_clock;

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

/// Resolves `host` for a listening socket; Error naming the address when it cannot.
void resolve(const std::string& host, int port, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &out.list); rc != 0)
    throw Error("metrics server: cannot resolve bind address '" + host + "': " + gai_strerror(rc));
}

bool loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 100));  // slices: see `stopping`
}

struct Response {
  int status = 200;
  std::string reason = "OK";
  std::string body;
  std::string extra_headers;
  std::string content_type = "text/plain; charset=utf-8";
};

std::string render(const Response& r) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + ' ' + r.reason + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += r.extra_headers;
  out += "Connection: close\r\n\r\n";
  return out + r.body;
}

Response plain(int status, std::string reason, std::string body) {
  Response r;
  r.status = status;
  r.reason = std::move(reason);
  r.body = std::move(body) + "\n";
  return r;
}

}  // namespace

bool equal_in_constant_time(const std::string& a, const std::string& b) {
  // Runs over the longer length so that neither content nor a common prefix shows in the time.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool is_loopback(const std::string& bind) {
  AddrInfo info;
  try {
    resolve(bind, 0, info);
  } catch (const Error&) {
    return false;
  }
  for (const addrinfo* a = info.list; a; a = a->ai_next)
    if (!loopback(a->ai_addr)) return false;
  return info.list != nullptr;
}

std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ValueError("metrics token file '" + path + "' cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = trim(ss.str());
  if (token.empty()) throw ValueError("metrics token file '" + path + "' is empty");
  return token;
}

struct Server::Impl {
  const Registry& registry;
  ServerOptions options;
  int listener = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::thread acceptor;
  std::atomic<bool> stopping{false};
  std::mutex mutex;
  std::condition_variable idle;
  size_t active = 0;  ///< connections being served; guarded by mutex

  Impl(const Registry& r, ServerOptions o) : registry(r), options(std::move(o)) {}

  void listen_on() {
    AddrInfo info;
    resolve(options.bind, options.port, info);
    std::string last_error = "no address";
    for (const addrinfo* a = info.list; a; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
        sockaddr_storage local{};
        socklen_t len = sizeof local;
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
        port = ntohs(local.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&local)->sin_port);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        listener = fd;
        return;
      }
      last_error = std::strerror(errno);
      ::close(fd);
    }
    throw Error("metrics server: cannot listen on " + options.bind + ":" + std::to_string(options.port) + ": " +
                last_error);
  }

  void accept_loop() {
    for (;;) {
      pollfd fds[2] = {{wake[0], POLLIN, 0}, {listener, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (stopping) return;
      if (!(fds[1].revents & POLLIN)) continue;
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {  // transient; out of descriptors or memory leaves the listener readable: no busy loop
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      const auto deadline = Clock::now() + options.connection_deadline;
      {
        std::lock_guard lock(mutex);
        if (active >= options.max_connections) {
          const std::string busy = render(plain(503, "Service Unavailable", "too many connections"));
          (void)::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // best effort
          ::close(fd);
          continue;
        }
        ++active;
      }
      try {
        std::thread([this, fd, deadline] {
          serve(fd, deadline);
          ::close(fd);
          std::lock_guard lock(mutex);
          --active;
          idle.notify_all();
        }).detach();
      } catch (const std::system_error&) {  // no thread to be had: drop this connection
        ::close(fd);
        std::lock_guard lock(mutex);
        --active;
      }
    }
  }

  /// Reads the request head into `head`; false on a timeout, a closed connection or stop.
  /// Sets `too_large` when max_head_bytes pass without the end of the head.
  bool read_head(int fd, Clock::time_point deadline, std::string& head, bool& too_large) {
    std::vector<char> buf(options.max_head_bytes);
    size_t got = 0;
    for (;;) {
      if (stopping) return false;
      const std::string_view seen(buf.data(), got);
      if (seen.find("\r\n\r\n") != std::string_view::npos || seen.find("\n\n") != std::string_view::npos) {
        head.assign(buf.data(), got);
        return true;
      }
      if (got == buf.size()) {
        too_large = true;
        return true;
      }
      if (Clock::now() >= deadline) return false;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) < 0 && errno != EINTR) return false;
      if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::recv(fd, buf.data() + got, buf.size() - got, 0);
      if (n == 0) return false;
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return false;
      }
      got += static_cast<size_t>(n);
    }
  }

  void write_all(int fd, const std::string& data, Clock::time_point deadline) {
    size_t sent = 0;
    while (sent < data.size() && !stopping && Clock::now() < deadline) {
      const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) < 0 && errno != EINTR) return;
    }
  }

  Response respond(const std::string& head) {
    const auto line_end = head.find('\n');
    std::istringstream request_line(trim(head.substr(0, line_end)));
    std::string method, target, version, extra;
    request_line >> method >> target >> version;
    if (method.empty() || target.empty() || version.rfind("HTTP/1.", 0) != 0 || (request_line >> extra))
      return plain(400, "Bad Request", "malformed request line");
    if (!options.token.empty() && !authorized(head.substr(line_end + 1))) {
      Response r = plain(401, "Unauthorized", "a bearer token is required");
      r.extra_headers = "WWW-Authenticate: Bearer realm=\"metrics\"\r\n";
      return r;
    }
    const std::string path = target.substr(0, target.find('?'));
    if (path != "/metrics") return plain(404, "Not Found", "only /metrics is served");
    if (method != "GET") {
      Response r = plain(405, "Method Not Allowed", "only GET is allowed");
      r.extra_headers = "Allow: GET\r\n";
      return r;
    }
    Response r;
    try {
      r.body = registry.expose();
    } catch (const std::exception& e) {
      return plain(500, "Internal Server Error", e.what());
    }
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    return r;
  }

  /// One "Authorization: Bearer <token>" header with this server's token.
  bool authorized(const std::string& headers) {
    std::istringstream lines(headers);
    std::string line;
    bool ok = false;
    while (std::getline(lines, line)) {
      const auto colon = line.find(':');
      if (colon == std::string::npos || ascii_lower(trim(line.substr(0, colon))) != "authorization") continue;
      const std::string value = trim(line.substr(colon + 1));
      if (value.size() < 7 || ascii_lower(value.substr(0, 7)) != "bearer ") return false;
      if (ok) return false;  // given twice
      ok = equal_in_constant_time(trim(value.substr(7)), options.token);
      if (!ok) return false;
    }
    return ok;
  }

  void serve(int fd, Clock::time_point deadline) {
    std::string head;
    bool too_large = false;
    if (!read_head(fd, deadline, head, too_large)) return;  // slow, gone or stopping: just close
    const Response r = too_large
                           ? plain(431, "Request Header Fields Too Large",
                                   "the request head exceeds " + std::to_string(options.max_head_bytes) + " bytes")
                           : respond(head);
    write_all(fd, render(r), deadline);
    ::shutdown(fd, SHUT_WR);
    drain(fd, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
  }

  /// Reads and drops what the client still sends (at most 64 KiB, until `until`), so that
  /// closing with unread bytes does not reset the connection before the answer is read.
  void drain(int fd, Clock::time_point until) {
    char sink[4096];
    for (size_t dropped = 0; dropped < 64 * 1024 && Clock::now() < until;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, remaining_ms(until)) <= 0) continue;
      const ssize_t n = ::recv(fd, sink, sizeof sink, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
      if (n > 0) dropped += static_cast<size_t>(n);
    }
  }
};

Server::Server(const Registry& registry, ServerOptions options)
    : impl_(std::make_unique<Impl>(registry, std::move(options))) {
  auto& im = *impl_;
  if (im.options.port < 0 || im.options.port > 65535)
    throw ValueError("metrics server: port " + std::to_string(im.options.port) + " is out of range (0-65535)");
  if (im.options.max_connections == 0 || im.options.max_head_bytes < 64)
    throw ValueError("metrics server: max_connections must be >= 1 and max_head_bytes >= 64");
  if (im.options.token.empty() && !is_loopback(im.options.bind))
    throw ValueError("metrics server: binding " + im.options.bind +
                     " (not a loopback address) requires a token (caf-node --metrics-token-file, "
                     "trainer.prometheus.token_file)");
  im.listen_on();
  if (::pipe2(im.wake, O_CLOEXEC) != 0) {
    ::close(im.listener);
    throw Error(std::string("metrics server: pipe: ") + std::strerror(errno));
  }
  im.acceptor = std::thread([&im] { im.accept_loop(); });
}

Server::~Server() {
  auto& im = *impl_;
  im.stopping = true;
  const char byte = 1;
  (void)!::write(im.wake[1], &byte, 1);
  im.acceptor.join();
  {
    std::unique_lock lock(im.mutex);
    im.idle.wait(lock, [&] { return im.active == 0; });
  }
  ::close(im.listener);
  ::close(im.wake[0]);
  ::close(im.wake[1]);
}

int Server::port() const {
  return impl_->port;
}

std::string Server::address() const {
  const auto& bind = impl_->options.bind;
  const bool v6 = bind.find(':') != std::string::npos;
  return (v6 ? "[" + bind + "]" : bind) + ":" + std::to_string(impl_->port);
}

}  // namespace hyflow::metrics
