// TCP sockets of the cluster module (net.hpp): POSIX sockets, every wait through poll().
#include "net.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <utility>

namespace hyflow::cluster::net {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

using AddrList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

/// The addresses of host:port for TCP (`passive`: to listen on; an empty host is every interface).
AddrList resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const char* node = host.empty() && passive ? nullptr : host.c_str();
  if (int rc = ::getaddrinfo(node, service.c_str(), &hints, &res); rc != 0)
    throw NetError("cannot resolve host '" + host + "': " + gai_strerror(rc));
  return AddrList(res, ::freeaddrinfo);
}

/// The time one wait may take: each_wait, cut at the deadline.
int wait_ms(const Timeouts& t) {
  const auto each = std::min<std::chrono::milliseconds::rep>(t.each_wait.count(), INT_MAX);
  return std::min(static_cast<int>(std::max<std::chrono::milliseconds::rep>(each, 0)), remaining_ms(t.deadline));
}

/// Waits until `fd` is ready for `events`; false on timeout. NetError on poll errors.
bool wait_for(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int rc = ::poll(&p, 1, timeout_ms);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw NetError("poll failed: " + errno_text(errno));
  }
}

/// A send or receive that failed with `e`: the peer's doing (closed, reset) or another error.
NetError::Kind closed_kind(int e) {
  return e == ECONNRESET || e == EPIPE || e == ECONNABORTED ? NetError::Kind::closed : NetError::Kind::other;
}

std::string progress(size_t done, size_t n) { return std::to_string(done) + " of " + std::to_string(n) + " bytes"; }

}  // namespace

// ---- descriptors -------------------------------------------------------------------------

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

int Fd::release() { return std::exchange(fd_, -1); }

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int remaining_ms(Clock::time_point deadline) {
  const auto now = Clock::now();
  if (deadline <= now) return 0;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<decltype(left)>(left, INT_MAX));
}

// ---- listening and accepting -------------------------------------------------------------

Fd listen_tcp(const std::string& bind, int port, int backlog) {
  const AddrList addrs = resolve(bind, port, /*passive=*/true);
  std::string failure = "cannot bind: no address";
  for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) {
      failure = "socket failed: " + errno_text(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      failure = "cannot bind: " + errno_text(errno);
      continue;
    }
    if (::listen(fd.get(), backlog) != 0) {
      failure = "cannot listen: " + errno_text(errno);
      continue;
    }
    return fd;
  }
  throw NetError(failure);
}

int local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

int free_port(const std::string& bind) {
  try {
    return local_port(listen_tcp(bind, 0, 1).get());
  } catch (const NetError&) {
    return 0;
  }
}

Fd accept_one(int listen_fd, std::string* peer_ip) {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    Fd fd(::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EINTR) continue;
      return fd;  // none waiting, or a transient error (EMFILE, ECONNABORTED): the next poll tries again
    }
    set_nodelay(fd.get());
    if (peer_ip) {
      char host[INET6_ADDRSTRLEN] = "?";
      if (addr.ss_family == AF_INET)
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, host, sizeof host);
      else if (addr.ss_family == AF_INET6)
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, host, sizeof host);
      *peer_ip = host;
    }
    return fd;
  }
}

// ---- connecting --------------------------------------------------------------------------

Fd connect_tcp(const std::string& host, int port, const Timeouts& timeouts) {
  const AddrList addrs = resolve(host, port, /*passive=*/false);
  std::string last = "no address";
  for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      last = errno_text(errno);
      continue;
    }
    set_nodelay(fd.get());
    const int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last = errno_text(errno);
      continue;
    }
    if (rc != 0) {
      if (!wait_for(fd.get(), POLLOUT, wait_ms(timeouts))) {
        last = "connect timed out after " + std::to_string(timeouts.each_wait.count()) + " ms";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = errno_text(err);
        continue;
      }
    }
    return fd;
  }
  throw NetError(last);
}

// ---- transfers ---------------------------------------------------------------------------

void write_all(int fd, const void* data, size_t n, const Timeouts& timeouts) {
  const auto* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t k = ::send(fd, bytes + done, n - done, MSG_NOSIGNAL);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLOUT, wait_ms(timeouts)))
        throw NetError("send timed out after " + std::to_string(timeouts.each_wait.count()) + " ms (" +
                           progress(done, n) + " sent)",
                       NetError::Kind::timed_out, done);
      continue;
    }
    const int e = errno;
    throw NetError("send failed after " + progress(done, n) + ": " + errno_text(e), closed_kind(e), done);
  }
}

void read_all(int fd, void* data, size_t n, const Timeouts& timeouts) {
  auto* bytes = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t k = ::recv(fd, bytes + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0)
      throw NetError("short read: the peer closed the connection after " + progress(done, n), NetError::Kind::closed,
                     done);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, wait_ms(timeouts)))
        throw NetError("receive timed out after " + std::to_string(timeouts.each_wait.count()) + " ms (" +
                           progress(done, n) + " received)",
                       NetError::Kind::timed_out, done);
      continue;
    }
    const int e = errno;
    throw NetError("receive failed after " + progress(done, n) + ": " + errno_text(e), closed_kind(e), done);
  }
}

bool send_now(int fd, const void* data, size_t n) {
  return ::send(fd, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

ReadState read_available(int fd, void* buf, size_t n, size_t& got) {
  auto* bytes = static_cast<char*>(buf);
  while (got < n) {
    ssize_t k = ::recv(fd, bytes + got, n - got, 0);
    if (k > 0) {
      got += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ReadState::partial;
    return ReadState::closed;
  }
  return ReadState::complete;
}

// ---- waking a poll loop ------------------------------------------------------------------

Waker::Waker() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw NetError("cannot create a wake pipe: " + errno_text(errno));
  read_ = Fd(fds[0]);
  write_ = Fd(fds[1]);
}

void Waker::wake() {
  const char stop = 1;
  [[maybe_unused]] auto n = ::write(write_.get(), &stop, 1);
}

}  // namespace hyflow::cluster::net
