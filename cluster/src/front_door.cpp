// The node's front door (front_door.hpp): a fixed-size challenge-response on the raw TCP
// connection before CAF's BASP broker sees a single byte.
#include "front_door.hpp"

#include <hyflow/cluster/node_info.hpp>

#include "crypto.hpp"
#include "net.hpp"

#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace hyflow::cluster::detail {
namespace {

using Clock = net::Clock;
using crypto::Bytes32;

constexpr char kNodeMagic[4] = {'H', 'F', 'N', 'D'};
constexpr char kClientMagic[4] = {'H', 'F', 'C', 'T'};
constexpr uint8_t kFlagSecret = 1, kFlagTls = 2;
constexpr uint8_t kStatusOk = 0, kStatusVersion = 1, kStatusSecret = 2;
constexpr size_t kGreetingBytes = 4 + 4 + 1 + 32;
constexpr size_t kHelloBytes = 4 + 4 + 32 + 32;
constexpr size_t kReplyBytes = 1 + 32;

/// HMAC-SHA256(secret, label | a | b); zeros without a secret.
Bytes32 proof(const std::string& secret, const char* label, const Bytes32& a, const Bytes32& b) {
  if (secret.empty()) return Bytes32{};
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(a.data()), a.size());
  msg.append(reinterpret_cast<const char*>(b.data()), b.size());
  return crypto::hmac_sha256(secret, msg);
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

}  // namespace

// ---- node side ---------------------------------------------------------------------------

struct FrontDoor::Impl {
  struct Pending {
    net::Fd fd;
    std::string peer;  ///< the peer's IP address
    Clock::time_point deadline;
    Bytes32 nonce{};
    std::array<unsigned char, kHelloBytes> hello{};
    size_t got = 0;
  };

  FrontDoorOptions options;
  std::function<void(int)> admit;
  net::Fd listener;
  std::optional<net::Waker> waker;
  int port = 0;
  std::thread loop;
  mutable std::mutex mutex;
  FrontDoorStats stats;
  std::vector<Pending> pending;

  void count(uint64_t FrontDoorStats::*field) {
    std::lock_guard lock(mutex);
    ++(stats.*field);
  }

  void accept_some() {
    for (;;) {
      std::string host;
      net::Fd fd = net::accept_one(listener.get(), &host);
      if (!fd) return;  // none waiting, or a transient error: try again on the next event
      count(&FrontDoorStats::accepted);
      const size_t from_peer = static_cast<size_t>(
          std::count_if(pending.begin(), pending.end(), [&](const Pending& q) { return q.peer == host; }));
      if (pending.size() >= options.max_pending || from_peer >= options.max_pending_per_peer) {
        count(&FrontDoorStats::over_capacity);
        continue;  // closed
      }
      Pending p;
      p.fd = std::move(fd);
      p.peer = host;
      p.deadline = Clock::now() + options.handshake_timeout;
      try {
        p.nonce = crypto::random32("a random challenge");
      } catch (const std::exception& e) {
        cluster_log(std::string("front door: ") + e.what());
        continue;
      }
      unsigned char greeting[kGreetingBytes];
      std::memcpy(greeting, kNodeMagic, 4);
      put_u32(greeting + 4, kNodeProtocolVersion);
      greeting[8] =
          static_cast<unsigned char>((options.secret.empty() ? 0 : kFlagSecret) | (options.tls ? kFlagTls : 0));
      std::memcpy(greeting + 9, p.nonce.data(), 32);
      // 41 bytes into a fresh socket's empty send buffer: all or nothing.
      if (!net::send_now(p.fd.get(), greeting, sizeof greeting)) continue;
      pending.push_back(std::move(p));
    }
  }

  /// Reads what `p` sent; true when the connection is finished with (admitted or closed).
  bool progress(Pending& p) {
    switch (net::read_available(p.fd.get(), p.hello.data(), kHelloBytes, p.got)) {
      case net::ReadState::partial: return false;
      case net::ReadState::complete: return finish(p);
      case net::ReadState::closed: break;
    }
    p.fd.reset();  // closed or reset before a complete hello
    count(&FrontDoorStats::refused);
    return true;
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
      if (!options.secret.empty() && !crypto::equal_in_constant_time(expected.data(), client_proof.data(), 32)) {
        reply[0] = kStatusSecret;
        count(&FrontDoorStats::wrong_secret);
        cluster_log("front door: wrong shared secret, connection refused");
      } else {
        reply[0] = kStatusOk;
        const Bytes32 mine = proof(options.secret, "hyflow-node-server", client_nonce, p.nonce);
        std::memcpy(reply + 1, mine.data(), 32);
        ok = true;
      }
    }
    const bool sent = net::send_now(p.fd.get(), reply, sizeof reply);
    if (!ok || !sent) {
      p.fd.reset();
      count(&FrontDoorStats::refused);
      return true;
    }
    count(&FrontDoorStats::admitted);
    admit(p.fd.release());  // CAF owns the socket from here on
    return true;
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({waker->fd(), POLLIN, 0});
      fds.push_back({listener.get(), POLLIN, 0});
      int timeout = -1;
      for (auto& p : pending) {
        fds.push_back({p.fd.get(), POLLIN, 0});
        const int left = net::remaining_ms(p.deadline);
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
          p.fd.reset();
          count(&FrontDoorStats::timed_out);
          continue;
        }
        still.push_back(std::move(p));
      }
      pending.swap(still);
      if (rc > 0 && fds[1].revents) accept_some();
    }
    pending.clear();  // closes them
  }
};

FrontDoor::FrontDoor(FrontDoorOptions options, std::function<void(int fd)> admit) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.options = std::move(options);
  im.admit = std::move(admit);
  const std::string where = im.options.bind + ":" + std::to_string(im.options.port);
  try {
    im.listener = net::listen_tcp(im.options.bind, im.options.port, 128);
    im.waker.emplace();
  } catch (const net::NetError& e) {
    throw ClusterError("cannot listen on " + where + ": " + e.what());
  }
  im.port = net::local_port(im.listener.get());
  im.loop = std::thread([&im] { im.run(); });
}

FrontDoor::~FrontDoor() {
  auto& im = *impl_;
  im.waker->wake();
  if (im.loop.joinable()) im.loop.join();
}

int FrontDoor::port() const {
  return impl_->port;
}

FrontDoorStats FrontDoor::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

// ---- controller side ---------------------------------------------------------------------

int front_door_connect(const std::string& host, int port, const std::string& secret, bool tls,
                       std::chrono::milliseconds timeout) {
  const std::string where = host + ":" + std::to_string(port);
  const net::Timeouts limits{.each_wait = timeout, .deadline = Clock::now() + timeout};
  auto fail = [&](const std::string& why) -> ClusterError {
    return ClusterError("cannot connect to node " + where + ": " + why);
  };
  net::Fd fd;
  try {
    fd = net::connect_tcp(host, port, limits);
  } catch (const net::NetError& e) {
    throw fail(e.what());
  }
  // One frame of the handshake; a failure names the step (and a hint).
  auto exchange = [&](unsigned char* frame, size_t n, bool sending, const std::string& step, const char* hint = "") {
    try {
      if (sending) net::write_all(fd.get(), frame, n, limits);
      else net::read_all(fd.get(), frame, n, limits);
    } catch (const net::NetError& e) {
      throw fail(step + " (" + e.what() + hint + ")");
    }
  };
  unsigned char greeting[kGreetingBytes];
  exchange(greeting, sizeof greeting, false, "no node greeting", "; is this a caf-node of this hyflow version?");
  if (std::memcmp(greeting, kNodeMagic, 4) != 0) throw fail("the peer is not a hyflow caf-node");
  const uint32_t version = get_u32(greeting + 4);
  if (version != kNodeProtocolVersion)
    throw fail("protocol version mismatch: node speaks v" + std::to_string(version) + ", controller v" +
               std::to_string(kNodeProtocolVersion));
  const bool node_tls = (greeting[8] & kFlagTls) != 0;
  if (node_tls && !tls)
    throw fail(
        "the node uses TLS and this controller does not (set cluster.tls_cert, cluster.tls_key and "
        "cluster.tls_ca)");
  if (!node_tls && tls)
    throw fail(
        "this controller uses TLS and the node does not (start caf-node with --tls-cert, --tls-key and "
        "--tls-ca, or drop the cluster.tls_* keys)");
  const bool needs_secret = (greeting[8] & kFlagSecret) != 0;
  if (needs_secret && secret.empty())
    throw fail("the node requires a shared secret and the controller has none (cluster secret file)");
  Bytes32 node_nonce{};
  std::memcpy(node_nonce.data(), greeting + 9, 32);
  const Bytes32 client_nonce = crypto::random32("a random challenge");
  const std::string used = needs_secret ? secret : std::string();
  const Bytes32 mine = proof(used, "hyflow-node-client", node_nonce, client_nonce);
  unsigned char hello[kHelloBytes];
  std::memcpy(hello, kClientMagic, 4);
  put_u32(hello + 4, kNodeProtocolVersion);
  std::memcpy(hello + 8, client_nonce.data(), 32);
  std::memcpy(hello + 40, mine.data(), 32);
  exchange(hello, sizeof hello, true, "sending the hello");
  unsigned char reply[kReplyBytes];
  exchange(reply, sizeof reply, false, "no answer to the hello");
  if (reply[0] == kStatusSecret)
    throw fail("authentication failed: the controller's shared secret does not match this node's");
  if (reply[0] != kStatusOk) throw fail("the node refused the hello (status " + std::to_string(reply[0]) + ")");
  if (needs_secret) {
    const Bytes32 expected = proof(used, "hyflow-node-server", client_nonce, node_nonce);
    if (!crypto::equal_in_constant_time(expected.data(), reply + 1, 32))
      throw fail("the node's answer does not prove the shared secret (not the node you configured?)");
  } else if (!secret.empty()) {
    cluster_log("warning: node " + where + " runs without a shared secret (any peer can use it)");
  }
  return fd.release();
}

}  // namespace hyflow::cluster::detail
