#include <hyflow/parallel/rendezvous_store.hpp>

#include <hyflow/core/error.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>

namespace hyflow::parallel {

namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

constexpr char kMagic[4] = {'H', 'F', 'S', 'T'};
constexpr uint8_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kGreetingBytes = sizeof(kMagic) + 1 + kNonceBytes;
constexpr size_t kProofBytes = 32;
constexpr uint8_t kAccepted = 1;

enum class Op : uint8_t { set = 1, get, add, check, wait, erase, num_keys, compare_set };
enum class Status : uint8_t { ok = 0, missing = 1 };

std::string errno_text() {
  return std::strerror(errno);
}

std::array<uint8_t, kProofBytes> proof_of(const std::string& token, const uint8_t* nonce) {
  static constexpr char kContext[] = "hyflow.store.v1";
  std::vector<uint8_t> message(kContext, kContext + sizeof(kContext) - 1);
  message.insert(message.end(), nonce, nonce + kNonceBytes);
  std::array<uint8_t, kProofBytes> out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message.data(), message.size(), out.data(),
            &len) ||
      len != out.size())
    throw Error("rendezvous store: HMAC-SHA256 failed (OpenSSL)");
  return out;
}

void put_u32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

uint32_t get_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

Bytes to_bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

std::string to_string(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

Bytes encode_int(int64_t v) {
  return to_bytes(std::to_string(v));
}

/// A message of the wire: a leading byte (op or status) and its strings.
struct Frame {
  uint8_t head = 0;
  std::vector<Bytes> strings;
};

Bytes serialize(const Frame& f) {
  Bytes out{f.head};
  put_u32(out, static_cast<uint32_t>(f.strings.size()));
  for (const auto& s : f.strings) {
    put_u32(out, static_cast<uint32_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

/// How many strings a request of `op` carries (min, max).
struct Shape {
  size_t min_count, max_count;
};

std::optional<Shape> shape_of(uint8_t op, const StoreLimits& l) {
  switch (static_cast<Op>(op)) {
    case Op::set:
    case Op::add:
      return Shape{2, 2};
    case Op::get:
    case Op::erase:
      return Shape{1, 1};
    case Op::check:
      return Shape{1, l.max_keys_per_request};
    case Op::wait:
      return Shape{2, l.max_keys_per_request + 1};  // the keys, then the timeout in ms
    case Op::num_keys:
      return Shape{0, 0};
    case Op::compare_set:
      return Shape{3, 3};
  }
  return std::nullopt;
}

size_t string_limit(uint8_t op, size_t index, size_t count, const StoreLimits& l) {
  switch (static_cast<Op>(op)) {
    case Op::set:
    case Op::compare_set:
      return index == 0 ? l.max_key_bytes : l.max_value_bytes;
    case Op::add:
      return index == 0 ? l.max_key_bytes : 20;
    case Op::wait:
      return index + 1 == count ? 20 : l.max_key_bytes;
    default:
      return l.max_key_bytes;
  }
}

enum class Parse { more, bad, done };

/// Parses one request at the front of `in` without copying until it is complete; `bad` when it
/// breaks a bound or its op's shape (checked as soon as the bytes that say so are there).
Parse parse_request(const Bytes& in, const StoreLimits& limits, Frame& out, size_t& consumed) {
  if (in.size() < 5) return Parse::more;
  const uint8_t op = in[0];
  const auto shape = shape_of(op, limits);
  if (!shape) return Parse::bad;
  const size_t count = get_u32(&in[1]);
  if (count < shape->min_count || count > shape->max_count) return Parse::bad;
  size_t at = 5;
  for (size_t i = 0; i < count; ++i) {
    if (in.size() < at + 4) return Parse::more;
    const size_t len = get_u32(&in[at]);
    if (len > string_limit(op, i, count, limits)) return Parse::bad;
    at += 4;
    if (in.size() < at + len) return Parse::more;
    at += len;
  }
  out.head = op;
  out.strings.clear();
  at = 5;
  for (size_t i = 0; i < count; ++i) {
    const size_t len = get_u32(&in[at]);
    out.strings.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(at + 4),
                             in.begin() + static_cast<std::ptrdiff_t>(at + 4 + len));
    at += 4 + len;
  }
  consumed = at;
  return Parse::done;
}

std::optional<int64_t> parse_int(const Bytes& b) {
  if (b.empty() || b.size() > 20) return std::nullopt;
  try {
    size_t used = 0;
    const std::string s = to_string(b);
    const long long v = std::stoll(s, &used);
    if (used != s.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// IPv4 address of `host` (a literal or a name), for bind and connect.
sockaddr_in resolve(const std::string& host, int port, const std::string& what) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1) return sa;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || !found)
    throw Error(what + ": cannot resolve '" + host + "' to an IPv4 address: " + ::gai_strerror(rc));
  sa.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
  ::freeaddrinfo(found);
  return sa;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server

struct RendezvousServer::Impl {
  struct Conn {
    int fd = -1;
    bool authed = false;
    std::array<uint8_t, kNonceBytes> nonce{};
    Bytes in;
    Bytes out;
    size_t out_at = 0;
    /// When the connection is closed unless it makes progress: its handshake, a request begun,
    /// an answer unread; max() while it idles authenticated.
    Clock::time_point deadline = Clock::time_point::max();
    /// A wait in progress: its keys and when it answers "missing".
    std::vector<std::string> wait_keys;
    Clock::time_point wait_until = Clock::time_point::max();
    bool waiting = false;
    bool closing = false;
  };

  RendezvousServerOptions options;
  int listen_fd = -1;
  int wake_pipe[2] = {-1, -1};
  int port = 0;
  std::thread thread;
  std::atomic<uint64_t> rejected{0};
  std::list<Conn> conns;  // in accept order: the front handshake is the oldest
  std::map<std::string, Bytes> data;

  void reject(Conn& c) {
    if (c.closing) return;
    c.closing = true;
    ++rejected;
  }

  size_t count(bool authed) const {
    return static_cast<size_t>(
        std::count_if(conns.begin(), conns.end(), [&](const Conn& c) { return !c.closing && c.authed == authed; }));
  }

  void accept_one() {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (count(true) >= options.max_connections) {
      ::close(fd);
      ++rejected;
      return;
    }
    if (count(false) >= options.max_handshakes) {  // the oldest handshake makes room
      for (auto& c : conns)
        if (!c.authed && !c.closing) {
          reject(c);
          break;
        }
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Conn c;
    c.fd = fd;
    if (RAND_bytes(c.nonce.data(), static_cast<int>(c.nonce.size())) != 1) {
      ::close(fd);
      return;
    }
    c.out.assign(kMagic, kMagic + sizeof(kMagic));
    c.out.push_back(kVersion);
    c.out.insert(c.out.end(), c.nonce.begin(), c.nonce.end());
    c.deadline = Clock::now() + options.handshake_timeout;
    conns.push_back(std::move(c));
  }

  void answer(Conn& c, Status status, std::vector<Bytes> strings = {}) {
    const auto bytes = serialize(Frame{static_cast<uint8_t>(status), std::move(strings)});
    c.out.insert(c.out.end(), bytes.begin(), bytes.end());
    if (c.deadline == Clock::time_point::max()) c.deadline = Clock::now() + options.request_timeout;
  }

  bool all_present(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
  }

  void serve(Conn& c, Frame& req) {
    auto& s = req.strings;
    switch (static_cast<Op>(req.head)) {
      case Op::set:
        data[to_string(s[0])] = std::move(s[1]);
        answer(c, Status::ok);
        return;
      case Op::get: {
        auto it = data.find(to_string(s[0]));
        if (it == data.end()) answer(c, Status::missing);
        else answer(c, Status::ok, {it->second});
        return;
      }
      case Op::add: {
        const std::string key = to_string(s[0]);
        const auto it = data.find(key);
        const auto delta = parse_int(s[1]);
        const auto now = it == data.end() ? std::optional<int64_t>(0) : parse_int(it->second);
        int64_t sum = 0;
        if (!delta || !now || __builtin_add_overflow(*now, *delta, &sum)) {
          reject(c);  // not an integer, or out of range: a confused or hostile peer
          return;
        }
        auto& slot = data[key];
        slot = encode_int(sum);
        answer(c, Status::ok, {slot});
        return;
      }
      case Op::check: {
        std::vector<std::string> keys;
        for (auto& k : s) keys.push_back(to_string(k));
        answer(c, Status::ok, {to_bytes(all_present(keys) ? "1" : "0")});
        return;
      }
      case Op::wait: {
        const auto ms = parse_int(s.back());
        if (!ms || *ms < 0) {
          reject(c);
          return;
        }
        c.wait_keys.clear();
        for (size_t i = 0; i + 1 < s.size(); ++i) c.wait_keys.push_back(to_string(s[i]));
        if (all_present(c.wait_keys)) {
          answer(c, Status::ok);
          return;
        }
        c.waiting = true;
        constexpr int64_t kYear = int64_t{365} * 24 * 3600 * 1000;  // keeps the deadline's arithmetic in range
        c.wait_until = Clock::now() + std::chrono::milliseconds(std::min(*ms, kYear));
        return;
      }
      case Op::erase:
        answer(c, Status::ok, {to_bytes(data.erase(to_string(s[0])) ? "1" : "0")});
        return;
      case Op::num_keys:
        answer(c, Status::ok, {encode_int(static_cast<int64_t>(data.size()))});
        return;
      case Op::compare_set: {
        const std::string key = to_string(s[0]);
        auto it = data.find(key);
        if (it == data.end()) {
          if (s[1].empty()) {
            data[key] = s[2];
            answer(c, Status::ok, {s[2]});
          } else {
            answer(c, Status::ok, {s[1]});
          }
          return;
        }
        if (it->second == s[1]) it->second = s[2];
        answer(c, Status::ok, {it->second});
        return;
      }
    }
  }

  /// Answers the waits whose keys are all there now, and those whose time is up.
  void settle_waits() {
    const auto now = Clock::now();
    for (auto& c : conns) {
      if (!c.waiting || c.closing) continue;
      if (all_present(c.wait_keys)) {
        c.waiting = false;
        answer(c, Status::ok);
      } else if (now >= c.wait_until) {
        c.waiting = false;
        answer(c, Status::missing);
      }
    }
  }

  void read_from(Conn& c) {
    std::array<uint8_t, 64 * 1024> buf;
    // Before the proof, read no more than the proof.
    const size_t want = c.authed ? buf.size() : kProofBytes - c.in.size();
    const ssize_t n = ::recv(c.fd, buf.data(), want, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      c.closing = true;  // the peer left
      return;
    }
    if (n < 0) return;
    c.in.insert(c.in.end(), buf.begin(), buf.begin() + n);
    if (!c.authed) {
      if (c.in.size() < kProofBytes) return;
      const auto expected = proof_of(options.token, c.nonce.data());
      if (CRYPTO_memcmp(expected.data(), c.in.data(), kProofBytes) != 0) {
        reject(c);
        return;
      }
      c.authed = true;
      c.in.clear();
      c.out.push_back(kAccepted);
      c.deadline = Clock::now() + options.request_timeout;  // until the acceptance is read
      return;
    }
    process_requests(c);
  }

  void process_requests(Conn& c) {
    while (!c.closing && !c.waiting && !c.in.empty()) {
      Frame req;
      size_t consumed = 0;
      const auto parsed = parse_request(c.in, options.limits, req, consumed);
      if (parsed == Parse::bad) {
        reject(c);
        return;
      }
      if (parsed == Parse::more) {
        if (c.deadline == Clock::time_point::max()) c.deadline = Clock::now() + options.request_timeout;
        return;
      }
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(consumed));
      if (c.out.empty()) c.deadline = Clock::time_point::max();
      const bool mutation = req.head == static_cast<uint8_t>(Op::set) || req.head == static_cast<uint8_t>(Op::add) ||
                            req.head == static_cast<uint8_t>(Op::compare_set);
      serve(c, req);
      if (mutation) settle_waits();
    }
  }

  void write_to(Conn& c) {
    while (c.out_at < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_at, c.out.size() - c.out_at, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        c.closing = true;
        return;
      }
      c.out_at += static_cast<size_t>(n);
    }
    c.out.clear();
    c.out_at = 0;
    if (c.authed) {
      c.deadline = c.in.empty() ? Clock::time_point::max() : Clock::now() + options.request_timeout;
      process_requests(c);  // requests that arrived while the answer was going out
    }
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      settle_waits();
      const auto now = Clock::now();
      for (auto& c : conns)
        if (!c.closing && now >= c.deadline) reject(c);  // slow handshake, request or reader
      for (auto it = conns.begin(); it != conns.end();) {
        if (!it->closing) {
          ++it;
          continue;
        }
        ::close(it->fd);
        it = conns.erase(it);
      }
      auto next = Clock::time_point::max();
      for (const auto& c : conns) next = std::min({next, c.deadline, c.waiting ? c.wait_until : next});
      int timeout_ms = -1;
      if (next != Clock::time_point::max())
        timeout_ms = static_cast<int>(
            std::clamp<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1, 0,
                                60000));
      fds.clear();
      fds.push_back({wake_pipe[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (const auto& c : conns) {
        short events = c.waiting ? 0 : POLLIN;
        if (c.out_at < c.out.size()) events |= POLLOUT;
        fds.push_back({c.fd, events, 0});
      }
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
      if (fds[0].revents) return;  // destructor
      size_t i = 2;
      for (auto& c : conns) {
        const short ev = fds[i++].revents;
        if (c.closing || ev == 0) continue;
        if (ev & POLLOUT) write_to(c);
        if (!c.closing && (ev & (POLLIN | POLLHUP | POLLERR))) read_from(c);
        if (!c.closing && !c.out.empty()) write_to(c);
      }
      if (fds[1].revents & POLLIN) accept_one();
    }
  }
};

RendezvousServer::RendezvousServer(RendezvousServerOptions options) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.options = std::move(options);
  const std::string where = im.options.address + ":" + std::to_string(im.options.port);
  auto sa = resolve(im.options.address, im.options.port, "rendezvous store");
  im.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (im.listen_fd < 0) throw Error("rendezvous store: socket() failed: " + errno_text());
  const int one = 1;
  ::setsockopt(im.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(im.listen_fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(im.listen_fd, 128) != 0) {
    const std::string err = errno_text();
    ::close(im.listen_fd);
    throw Error("rendezvous store: cannot listen on " + where + ": " + err);
  }
  socklen_t len = sizeof(sa);
  ::getsockname(im.listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
  im.port = ntohs(sa.sin_port);
  if (::pipe2(im.wake_pipe, O_CLOEXEC) != 0) {
    ::close(im.listen_fd);
    throw Error("rendezvous store: pipe() failed: " + errno_text());
  }
  im.thread = std::thread([&im] { im.run(); });
}

RendezvousServer::~RendezvousServer() {
  auto& im = *impl_;
  const char byte = 0;
  if (::write(im.wake_pipe[1], &byte, 1) < 0) {
    // the pipe cannot be full: nothing else writes to it
  }
  im.thread.join();
  for (auto& c : im.conns) ::close(c.fd);
  ::close(im.listen_fd);
  ::close(im.wake_pipe[0]);
  ::close(im.wake_pipe[1]);
}

int RendezvousServer::port() const {
  return impl_->port;
}

uint64_t RendezvousServer::rejected_connections() const {
  return impl_->rejected;
}

// ---------------------------------------------------------------------------------------------
// Client

struct RendezvousClient::Impl {
  RendezvousClientOptions options;
  std::string where;
  std::mutex mutex;
  int fd = -1;

  ~Impl() { disconnect(); }

  void disconnect() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    disconnect();
    throw Error("rendezvous store at " + where + ": " + what + ": " + why);
  }

  int remaining_ms(Clock::time_point deadline) const {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
  }

  void send_all(const Bytes& bytes, Clock::time_point deadline, const std::string& what) {
    size_t at = 0;
    while (at < bytes.size()) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, remaining_ms(deadline));
      if (r == 0) fail(what, "timed out sending");
      if (r < 0 && errno == EINTR) continue;
      const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) fail(what, "send failed: " + errno_text());
      at += static_cast<size_t>(n);
    }
  }

  void recv_exact(uint8_t* out, size_t n, Clock::time_point deadline, const std::string& what) {
    size_t at = 0;
    while (at < n) {
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, remaining_ms(deadline));
      if (r == 0) fail(what, "no answer in time");
      if (r < 0 && errno == EINTR) continue;
      const ssize_t got = ::recv(fd, out + at, n - at, 0);
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (got == 0) fail(what, "the store closed the connection");
      if (got < 0) fail(what, "receive failed: " + errno_text());
      at += static_cast<size_t>(got);
    }
  }

  /// Connects (retrying while the server does not listen yet) and proves the token.
  void connect(Clock::time_point deadline) {
    const auto sa = resolve(options.address, options.port, "rendezvous store");
    std::string last = "not tried";
    while (fd < 0) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) fail("connect", "socket() failed: " + errno_text());
      int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa));
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        rc = ::poll(&p, 1, remaining_ms(deadline)) == 1 ? 0 : -1;
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (rc == 0 && err != 0) {
          rc = -1;
          errno = err;
        }
        if (rc != 0 && err == 0) errno = ETIMEDOUT;
      }
      if (rc == 0) break;
      last = errno_text();
      ::close(fd);
      fd = -1;
      if (Clock::now() >= deadline) fail("connect", last);
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, remaining_ms(deadline))));
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::array<uint8_t, kGreetingBytes> greeting{};
    recv_exact(greeting.data(), greeting.size(), deadline, "handshake");
    if (std::memcmp(greeting.data(), kMagic, sizeof(kMagic)) != 0 || greeting[sizeof(kMagic)] != kVersion)
      fail("handshake", "the peer is not a hyflow rendezvous store of this version");
    const auto proof = proof_of(options.token, greeting.data() + sizeof(kMagic) + 1);
    send_all(Bytes(proof.begin(), proof.end()), deadline, "handshake");
    uint8_t accepted = 0;
    try {
      recv_exact(&accepted, 1, deadline, "handshake");
    } catch (const Error&) {
      fail("handshake", "the store refused this rank's proof of the group's token (a different store_token?)");
    }
    if (accepted != kAccepted) fail("handshake", "unexpected acceptance byte");
  }

  /// One request and its answer; the connection is dropped on any failure (the stream is out
  /// of step), the next request reconnects.
  Frame request(const Frame& req, std::chrono::milliseconds extra, const std::string& what) {
    std::lock_guard lock(mutex);
    const auto deadline = Clock::now() + options.timeout + extra;
    if (fd < 0) connect(Clock::now() + options.timeout);
    send_all(serialize(req), deadline, what);
    std::array<uint8_t, 5> head{};
    recv_exact(head.data(), head.size(), deadline, what);
    Frame answer;
    answer.head = head[0];
    const size_t count = get_u32(&head[1]);
    if (count > 1) fail(what, "malformed answer (" + std::to_string(count) + " strings)");
    for (size_t i = 0; i < count; ++i) {
      std::array<uint8_t, 4> len_bytes{};
      recv_exact(len_bytes.data(), 4, deadline, what);
      const size_t len = get_u32(len_bytes.data());
      if (len > options.limits.max_value_bytes) fail(what, "answer of " + std::to_string(len) + " bytes");
      Bytes s(len);
      recv_exact(s.data(), len, deadline, what);
      answer.strings.push_back(std::move(s));
    }
    if (answer.head != static_cast<uint8_t>(Status::ok) && answer.head != static_cast<uint8_t>(Status::missing))
      fail(what, "malformed answer (status " + std::to_string(answer.head) + ")");
    return answer;
  }

  void check_key(const std::string& key, const std::string& what) const {
    if (key.size() > options.limits.max_key_bytes)
      throw ValueError("rendezvous store: " + what + ": key of " + std::to_string(key.size()) + " bytes (limit " +
                       std::to_string(options.limits.max_key_bytes) + ")");
  }

  const Bytes& only(const Frame& f, const std::string& what) {
    if (f.strings.size() != 1) fail(what, "answer without a value");
    return f.strings[0];
  }
};

RendezvousClient::RendezvousClient(RendezvousClientOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->where = impl_->options.address + ":" + std::to_string(impl_->options.port);
  std::lock_guard lock(impl_->mutex);
  impl_->connect(Clock::now() + impl_->options.timeout);
}

RendezvousClient::~RendezvousClient() = default;

const std::string& RendezvousClient::where() const {
  return impl_->where;
}

void RendezvousClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  impl_->check_key(key, "set");
  if (value.size() > impl_->options.limits.max_value_bytes)
    throw ValueError("rendezvous store: set '" + key + "': value of " + std::to_string(value.size()) +
                     " bytes (limit " + std::to_string(impl_->options.limits.max_value_bytes) + ")");
  impl_->request(Frame{static_cast<uint8_t>(Op::set), {to_bytes(key), value}}, {}, "set '" + key + "'");
}

std::optional<std::vector<uint8_t>> RendezvousClient::get(const std::string& key) {
  impl_->check_key(key, "get");
  auto f = impl_->request(Frame{static_cast<uint8_t>(Op::get), {to_bytes(key)}}, {}, "get '" + key + "'");
  if (f.head == static_cast<uint8_t>(Status::missing)) return std::nullopt;
  return impl_->only(f, "get '" + key + "'");
}

bool RendezvousClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return true;
  if (keys.size() > impl_->options.limits.max_keys_per_request)
    throw ValueError("rendezvous store: wait for " + std::to_string(keys.size()) + " keys (limit " +
                     std::to_string(impl_->options.limits.max_keys_per_request) + ")");
  Frame req{static_cast<uint8_t>(Op::wait), {}};
  for (const auto& k : keys) {
    impl_->check_key(k, "wait");
    req.strings.push_back(to_bytes(k));
  }
  req.strings.push_back(encode_int(std::max<int64_t>(0, timeout.count())));
  auto f = impl_->request(req, timeout, "wait for '" + keys.front() + "'");
  return f.head == static_cast<uint8_t>(Status::ok);
}

int64_t RendezvousClient::add(const std::string& key, int64_t delta) {
  impl_->check_key(key, "add");
  const std::string what = "add to '" + key + "'";
  auto f = impl_->request(Frame{static_cast<uint8_t>(Op::add), {to_bytes(key), encode_int(delta)}}, {}, what);
  const auto v = parse_int(impl_->only(f, what));
  if (!v) impl_->fail(what, "the answer is not an integer");
  return *v;
}

bool RendezvousClient::check(const std::vector<std::string>& keys) {
  Frame req{static_cast<uint8_t>(Op::check), {}};
  for (const auto& k : keys) {
    impl_->check_key(k, "check");
    req.strings.push_back(to_bytes(k));
  }
  if (req.strings.empty()) return true;
  auto f = impl_->request(req, {}, "check");
  return to_string(impl_->only(f, "check")) == "1";
}

bool RendezvousClient::erase(const std::string& key) {
  impl_->check_key(key, "erase");
  auto f = impl_->request(Frame{static_cast<uint8_t>(Op::erase), {to_bytes(key)}}, {}, "erase '" + key + "'");
  return to_string(impl_->only(f, "erase")) == "1";
}

int64_t RendezvousClient::num_keys() {
  auto f = impl_->request(Frame{static_cast<uint8_t>(Op::num_keys), {}}, {}, "num_keys");
  const auto v = parse_int(impl_->only(f, "num_keys"));
  if (!v) impl_->fail("num_keys", "the answer is not an integer");
  return *v;
}

std::vector<uint8_t> RendezvousClient::compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                                   const std::vector<uint8_t>& desired) {
  impl_->check_key(key, "compare_set");
  const std::string what = "compare_set '" + key + "'";
  auto f = impl_->request(Frame{static_cast<uint8_t>(Op::compare_set), {to_bytes(key), expected, desired}}, {}, what);
  return impl_->only(f, what);
}

}  // namespace hyflow::parallel
