// The node's front door (front_door.hpp): a fixed-size challenge-response on the raw TCP
// connection before CAF's BASP broker sees a single byte.
#include "front_door.hpp"

#include <hyflow/cluster/node_info.hpp>

#include "detail.hpp"

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
#include <mutex>
#include <thread>
#include <vector>

namespace hyflow::cluster::detail {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes32 = std::array<unsigned char, 32>;

constexpr char kNodeMagic[4] = {'H', 'F', 'N', 'D'};
constexpr char kClientMagic[4] = {'H', 'F', 'C', 'T'};
constexpr uint8_t kFlagSecret = 1, kFlagTls = 2;
constexpr uint8_t kStatusOk = 0, kStatusVersion = 1, kStatusSecret = 2;
constexpr size_t kGreetingBytes = 4 + 4 + 1 + 32;
constexpr size_t kHelloBytes = 4 + 4 + 32 + 32;
constexpr size_t kReplyBytes = 1 + 32;

Bytes32 random32() {
  Bytes32 b{};
  if (RAND_bytes(b.data(), static_cast<int>(b.size())) != 1)
    throw ClusterError("cannot draw a random challenge (RAND_bytes failed)");
  return b;
}

/// HMAC-SHA256(secret, label | a | b); zeros without a secret.
Bytes32 proof(const std::string& secret, const char* label, const Bytes32& a, const Bytes32& b) {
  Bytes32 out{};
  if (secret.empty()) return out;
  std::vector<unsigned char> msg(label, label + std::strlen(label));
  msg.insert(msg.end(), a.begin(), a.end());
  msg.insert(msg.end(), b.begin(), b.end());
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(), out.data(), &len) ||
      len != out.size())
    throw ClusterError("HMAC-SHA256 failed");
  return out;
}

void put_u32(unsigned char* p, uint32_t v) {
  p[0] = static_cast<unsigned char>(v >> 24);
  p[1] = static_cast<unsigned char>(v >> 16);
  p[2] = static_cast<unsigned char>(v >> 8);
  p[3] = static_cast<unsigned char>(v);
}
uint32_t get_u32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
}
void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

}  // namespace

// ---- node side ---------------------------------------------------------------------------

struct FrontDoor::Impl {
  struct Pending {
    int fd = -1;
    std::string peer;  ///< the peer's IP address
    Clock::time_point deadline;
    Bytes32 nonce{};
    std::array<unsigned char, kHelloBytes> hello{};
    size_t got = 0;
  };

  FrontDoorOptions options;
  std::function<void(int)> admit;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::thread loop;
  mutable std::mutex mutex;
  FrontDoorStats stats;
  std::vector<Pending> pending;

  void count(uint64_t FrontDoorStats::*field) {
    std::lock_guard lock(mutex);
    ++(stats.*field);
  }

  void accept_one() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;  // EAGAIN, or a transient error (EMFILE, ECONNABORTED): try again on the next event
      }
      count(&FrontDoorStats::accepted);
      char host[INET6_ADDRSTRLEN] = "?";
      if (addr.ss_family == AF_INET)
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, host, sizeof host);
      else if (addr.ss_family == AF_INET6)
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, host, sizeof host);
      const size_t from_peer = static_cast<size_t>(
          std::count_if(pending.begin(), pending.end(), [&](const Pending& q) { return q.peer == host; }));
      if (pending.size() >= options.max_pending || from_peer >= options.max_pending_per_peer) {
        ::close(fd);
        count(&FrontDoorStats::over_capacity);
        continue;
      }
      set_nodelay(fd);
      Pending p;
      p.fd = fd;
      p.peer = host;
      p.deadline = Clock::now() + options.handshake_timeout;
      try {
        p.nonce = random32();
      } catch (const std::exception& e) {
        cluster_log(std::string("front door: ") + e.what());
        ::close(fd);
        continue;
      }
      unsigned char greeting[kGreetingBytes];
      std::memcpy(greeting, kNodeMagic, 4);
      put_u32(greeting + 4, kNodeProtocolVersion);
      greeting[8] =
          static_cast<unsigned char>((options.secret.empty() ? 0 : kFlagSecret) | (options.tls ? kFlagTls : 0));
      std::memcpy(greeting + 9, p.nonce.data(), 32);
      // 41 bytes into a fresh socket's empty send buffer: all or nothing.
      if (::send(fd, greeting, sizeof greeting, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof greeting)) {
        ::close(fd);
        continue;
      }
      pending.push_back(p);
    }
  }

  /// Reads what `p` sent; true when the connection is finished with (admitted or closed).
  bool progress(Pending& p) {
    for (;;) {
      ssize_t k = ::recv(p.fd, p.hello.data() + p.got, kHelloBytes - p.got, 0);
      if (k > 0) {
        p.got += static_cast<size_t>(k);
        if (p.got == kHelloBytes) return finish(p);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      ::close(p.fd);  // closed or reset before a complete hello
      count(&FrontDoorStats::refused);
      return true;
    }
  }

  bool finish(Pending& p) {
    const unsigned char* h = p.hello.data();
    unsigned char reply[kReplyBytes] = {};
    bool ok = false;
    if (std::memcmp(h, kClientMagic, 4) != 0) {
      reply[0] = kStatusVersion;
    } else if (get_u32(h + 4) != kNodeProtocolVersion) {
      reply[0] = kStatusVersion;
      cluster_log("front door: refused a controller speaking protocol v" + std::to_string(get_u32(h + 4)) +
                  " (this node speaks v" + std::to_string(kNodeProtocolVersion) + ")");
    } else {
      Bytes32 client_nonce{}, client_proof{};
      std::memcpy(client_nonce.data(), h + 8, 32);
      std::memcpy(client_proof.data(), h + 40, 32);
      const Bytes32 expected = proof(options.secret, "hyflow-node-client", p.nonce, client_nonce);
      if (!options.secret.empty() && CRYPTO_memcmp(expected.data(), client_proof.data(), 32) != 0) {
        reply[0] = kStatusSecret;
        cluster_log("front door: wrong shared secret, connection refused");
      } else {
        reply[0] = kStatusOk;
        const Bytes32 mine = proof(options.secret, "hyflow-node-server", client_nonce, p.nonce);
        std::memcpy(reply + 1, mine.data(), 32);
        ok = true;
      }
    }
    const bool sent = ::send(p.fd, reply, sizeof reply, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof reply);
    if (!ok || !sent) {
      ::close(p.fd);
      count(&FrontDoorStats::refused);
      return true;
    }
    count(&FrontDoorStats::admitted);
    admit(p.fd);  // CAF owns the socket from here on
    return true;
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      int timeout = -1;
      for (auto& p : pending) {
        fds.push_back({p.fd, POLLIN, 0});
        const int left = remaining_ms(p.deadline);
        timeout = timeout < 0 ? left : std::min(timeout, left);
      }
      int rc = ::poll(fds.data(), fds.size(), timeout);
      if (rc < 0 && errno != EINTR) {
        cluster_log(std::string("front door: poll failed: ") + std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (rc > 0 && fds[0].revents) break;  // stop
      std::vector<Pending> still;
      const auto now = Clock::now();
      for (size_t i = 0; i < pending.size(); ++i) {
        auto& p = pending[i];
        if (rc > 0 && fds[i + 2].revents && progress(p)) continue;
        if (now >= p.deadline) {
          ::close(p.fd);
          count(&FrontDoorStats::timed_out);
          continue;
        }
        still.push_back(p);
      }
      pending.swap(still);
      if (rc > 0 && fds[1].revents) accept_one();
    }
    for (auto& p : pending) ::close(p.fd);
    pending.clear();
  }
};

FrontDoor::FrontDoor(FrontDoorOptions options, std::function<void(int fd)> admit) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.options = std::move(options);
  im.admit = std::move(admit);
  const std::string where = im.options.bind + ":" + std::to_string(im.options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(im.options.port);
  const char* node = im.options.bind.empty() ? nullptr : im.options.bind.c_str();
  if (int rc = ::getaddrinfo(node, service.c_str(), &hints, &res); rc != 0)
    throw ClusterError("cannot listen on " + where + ": " + gai_strerror(rc));
  std::string failure = "no address";
  for (addrinfo* a = res; a && im.listen_fd < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      im.listen_fd = fd;
    } else {
      failure = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (im.listen_fd < 0) throw ClusterError("cannot listen on " + where + ": " + failure);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(im.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  im.port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  set_nonblocking(im.listen_fd);
  if (::pipe2(im.wake, O_CLOEXEC) != 0) {
    ::close(im.listen_fd);
    throw ClusterError(std::string("cannot create the front door's wake pipe: ") + std::strerror(errno));
  }
  im.loop = std::thread([&im] { im.run(); });
}

FrontDoor::~FrontDoor() {
  auto& im = *impl_;
  const char stop = 1;
  [[maybe_unused]] auto n = ::write(im.wake[1], &stop, 1);
  if (im.loop.joinable()) im.loop.join();
  ::close(im.listen_fd);
  ::close(im.wake[0]);
  ::close(im.wake[1]);
}

int FrontDoor::port() const {
  return impl_->port;
}

FrontDoorStats FrontDoor::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

// ---- controller side ---------------------------------------------------------------------

namespace {

/// Sends or receives exactly n bytes before `deadline`; false with `why` set otherwise.
bool transfer(int fd, unsigned char* data, size_t n, bool sending, Clock::time_point deadline, std::string& why) {
  size_t done = 0;
  while (done < n) {
    ssize_t k = sending ? ::send(fd, data + done, n - done, MSG_NOSIGNAL) : ::recv(fd, data + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) {
      why = "the peer closed the connection after " + std::to_string(done) + " of " + std::to_string(n) + " bytes";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      why = std::strerror(errno);
      return false;
    }
    pollfd p{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    if (::poll(&p, 1, remaining_ms(deadline)) == 0) {
      why = "no answer in time";
      return false;
    }
  }
  return true;
}

}  // namespace

int front_door_connect(const std::string& host, int port, const std::string& secret, bool tls,
                       std::chrono::milliseconds timeout) {
  const std::string where = host + ":" + std::to_string(port);
  const auto deadline = Clock::now() + timeout;
  auto fail = [&](const std::string& why) -> ClusterError {
    return ClusterError("cannot connect to node " + where + ": " + why);
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) throw fail(gai_strerror(rc));
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    int s = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (s < 0) continue;
    if (::connect(s, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      ::close(s);
      continue;
    }
    pollfd p{s, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0) {
      why = "no answer within " + std::to_string(timeout.count()) + " ms";
      ::close(s);
      continue;
    }
    ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      why = std::strerror(err);
      ::close(s);
      continue;
    }
    fd = s;
  }
  ::freeaddrinfo(res);
  if (fd < 0) throw fail(why);
  set_nodelay(fd);
  auto close_and = [&](const std::string& text) {
    ::close(fd);
    return fail(text);
  };
  unsigned char greeting[kGreetingBytes];
  if (!transfer(fd, greeting, sizeof greeting, false, deadline, why))
    throw close_and("no node greeting (" + why + "; is this a caf-node of this hyflow version?)");
  if (std::memcmp(greeting, kNodeMagic, 4) != 0) throw close_and("the peer is not a hyflow caf-node");
  const uint32_t version = get_u32(greeting + 4);
  if (version != kNodeProtocolVersion)
    throw close_and("protocol version mismatch: node speaks v" + std::to_string(version) + ", controller v" +
                    std::to_string(kNodeProtocolVersion));
  const bool node_tls = (greeting[8] & kFlagTls) != 0;
  if (node_tls && !tls)
    throw close_and(
        "the node uses TLS and this controller does not (set cluster.tls_cert, cluster.tls_key and "
        "cluster.tls_ca)");
  if (!node_tls && tls)
    throw close_and(
        "this controller uses TLS and the node does not (start caf-node with --tls-cert, --tls-key and "
        "--tls-ca, or drop the cluster.tls_* keys)");
  const bool needs_secret = (greeting[8] & kFlagSecret) != 0;
  if (needs_secret && secret.empty())
    throw close_and("the node requires a shared secret and the controller has none (cluster secret file)");
  Bytes32 node_nonce{};
  std::memcpy(node_nonce.data(), greeting + 9, 32);
  const Bytes32 client_nonce = random32();
  const std::string used = needs_secret ? secret : std::string();
  const Bytes32 mine = proof(used, "hyflow-node-client", node_nonce, client_nonce);
  unsigned char hello[kHelloBytes];
  std::memcpy(hello, kClientMagic, 4);
  put_u32(hello + 4, kNodeProtocolVersion);
  std::memcpy(hello + 8, client_nonce.data(), 32);
  std::memcpy(hello + 40, mine.data(), 32);
  if (!transfer(fd, hello, sizeof hello, true, deadline, why)) throw close_and("sending the hello: " + why);
  unsigned char reply[kReplyBytes];
  if (!transfer(fd, reply, sizeof reply, false, deadline, why)) throw close_and("no answer to the hello: " + why);
  if (reply[0] == kStatusSecret)
    throw close_and("authentication failed: the controller's shared secret does not match this node's");
  if (reply[0] != kStatusOk) throw close_and("the node refused the hello (status " + std::to_string(reply[0]) + ")");
  if (needs_secret) {
    const Bytes32 expected = proof(used, "hyflow-node-server", client_nonce, node_nonce);
    if (CRYPTO_memcmp(expected.data(), reply + 1, 32) != 0)
      throw close_and("the node's answer does not prove the shared secret (not the node you configured?)");
  } else if (!secret.empty()) {
    cluster_log("warning: node " + where + " runs without a shared secret (any peer can use it)");
  }
  return fd;
}

}  // namespace hyflow::cluster::detail
