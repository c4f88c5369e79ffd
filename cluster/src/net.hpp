#pragma once
// Internal to the cluster module: the TCP sockets of the node's front door and the data plane.
// Every socket is non-blocking and close-on-exec, and every wait for a peer goes through poll()
// with a limit, so no operation can hang. Failures are NetError with the cause and how far a
// transfer got; callers wrap them into their own error that names the peer.

#include <hyflow/core/error.hpp>

#include <chrono>
#include <cstddef>
#include <string>

namespace hyflow::cluster::net {

using Clock = std::chrono::steady_clock;

/// A socket call failed, a peer went away or was too slow.
class NetError : public Error {
 public:
  enum class Kind {
    other,      ///< resolving, binding, polling, or an error of this side
    timed_out,  ///< the peer did not answer in time
    closed,     ///< the peer closed or reset the connection (or refused it: nothing listens)
  };
  explicit NetError(const std::string& what, Kind kind = Kind::other, size_t transferred = 0)
      : Error(what), kind_(kind), transferred_(transferred) {}
  Kind kind() const { return kind_; }
  /// Bytes of the failed transfer that did go through (0: none of this frame).
  size_t transferred() const { return transferred_; }

 private:
  Kind kind_;
  size_t transferred_;
};

/// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  /// Hands the descriptor over: this Fd no longer closes it.
  int release();
  /// Closes the descriptor now.
  void reset();

 private:
  int fd_;
};

/// How long a blocking operation waits for its peer: each wait at most `each_wait`, and none
/// past `deadline` (default: no bound on the whole). Timeout errors quote `each_wait`.
struct Timeouts {
  std::chrono::milliseconds each_wait;
  Clock::time_point deadline = Clock::time_point::max();
};

/// Milliseconds from now to `deadline`, 0 once passed (a poll() timeout).
int remaining_ms(Clock::time_point deadline);

/// A listening socket on `bind` (a name or an address of either family; empty: every
/// interface) and `port` (0: a free one): the first address `bind` resolves to that can be
/// bound. SO_REUSEADDR, non-blocking. NetError "cannot resolve ...", "cannot bind: ..." or
/// "cannot listen: ...".
Fd listen_tcp(const std::string& bind, int port, int backlog);
/// The local port of a bound socket.
int local_port(int fd);
/// A TCP port free on `bind` a moment ago (bound, read and closed); 0 when none can be bound.
int free_port(const std::string& bind);

/// Accepts one pending connection (non-blocking, TCP_NODELAY); an empty Fd when none is
/// waiting. `peer_ip`, when given, receives the peer's address ("?" when not IP).
Fd accept_one(int listen_fd, std::string* peer_ip = nullptr);

/// Connects to host:port, trying each address the host resolves to; the connected socket is
/// non-blocking with TCP_NODELAY. NetError with the last address's failure (refused,
/// "connect timed out after N ms", "cannot resolve host ...").
Fd connect_tcp(const std::string& host, int port, const Timeouts& timeouts);

/// Sends all n bytes. NetError "send timed out after N ms (k of n bytes sent)" or "send failed
/// after k of n bytes: ...".
void write_all(int fd, const void* data, size_t n, const Timeouts& timeouts);
/// Receives exactly n bytes. NetError "short read: the peer closed the connection after k of n
/// bytes", "receive timed out after N ms (k of n bytes received)" or "receive failed ...".
void read_all(int fd, void* data, size_t n, const Timeouts& timeouts);

/// One send of a small frame into a fresh socket's empty send buffer, without waiting: true
/// when all n bytes went.
bool send_now(int fd, const void* data, size_t n);

/// What read_available found.
enum class ReadState {
  partial,   ///< nothing more for now: poll again
  complete,  ///< all n bytes are in
  closed,    ///< the peer closed the connection, or it failed
};
/// Reads what has arrived on a non-blocking socket into buf[got, n), advancing `got`; never
/// waits, never reads past n.
ReadState read_available(int fd, void* buf, size_t n, size_t& got);

/// Wakes a poll() loop from another thread: poll fd() for POLLIN, call wake() to stop it.
class Waker {
 public:
  /// NetError when no pipe can be made.
  Waker();
  int fd() const { return read_.get(); }
  void wake();

 private:
  Fd read_, write_;
};

}  // namespace hyflow::cluster::net
