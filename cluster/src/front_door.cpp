// The node's front door (front_door.hpp): a fixed-size challenge-response on the raw TCP
// connection before CAF's BASP broker sees a single byte.
#include "front_door.hpp"

#include <hyflow/cluster/node_info.hpp>

#include "crypto.hpp"
#include "net.hpp"
#include "peer_log.hpp"

#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>
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
constexpr uint8_t kStatusOk = 0, kStatusVersion = 1, kStatusSecret = 2, kStatusBusy = 3, kStatusTimeout = 4;
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
  /// Unfinished handshakes in accept order (the oldest first).
  std::vector<Pending> pending;
  std::optional<PeerLog> log;

  void count(uint64_t FrontDoorStats::*field) {
    std::lock_guard lock(mutex);
    ++(stats.*field);
  }

  /// Answers `p` with a status that ends the handshake (no proof), then closes it.
  static void turn_away(Pending& p, uint8_t status) {
    unsigned char reply[kReplyBytes] = {status};
    net::send_now(p.fd.get(), reply, sizeof reply);
    p.fd.reset();
  }

  /// The unfinished handshake a connection from `host` replaces, if the door is full for it:
  /// the oldest of `host` when it holds max_pending_per_peer, else (all max_pending taken) the
  /// oldest of the address that holds the most; pending.size() when there is room.
  size_t victim_for(const std::string& host) const {
    std::map<std::string, size_t> held;
    for (const auto& p : pending) ++held[p.peer];
    std::string target;
    if (held[host] >= options.max_pending_per_peer) {
      target = host;
    } else if (pending.size() >= options.max_pending) {
      size_t most = 0;
      for (const auto& p : pending)  // oldest first: ties go to the address with the oldest handshake
        if (held[p.peer] > most) {
          most = held[p.peer];
          target = p.peer;
        }
    } else {
      return pending.size();
    }
    for (size_t i = 0; i < pending.size(); ++i)
      if (pending[i].peer == target) return i;
    return pending.size();
  }

  /// Makes room for a connection from `host`. A victim whose hello has arrived in the meantime
  /// is answered (admitted or refused), not evicted: the oldest unfinished handshake goes.
  void make_room(const std::string& host) {
    const size_t i = victim_for(host);
    if (i == pending.size()) return;
    Pending& p = pending[i];
    if (!progress(p)) {
      turn_away(p, kStatusBusy);
      count(&FrontDoorStats::evicted);
      log->note("unfinished handshakes evicted (door full)", p.peer, [&] {
        return "door full: evicted the oldest unfinished handshake from " + p.peer + " to admit a newer connection";
      });
    }
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void accept_some() {
    for (;;) {
      std::string host;
      net::Fd fd = net::accept_one(listener.get(), &host);
      if (!fd) return;  // none waiting, or a transient error: try again on the next event
      count(&FrontDoorStats::accepted);
      make_room(host);
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
      const uint32_t theirs = get_u32(h + 4);
      log->note("hellos of another protocol version refused", p.peer, [&] {
        return "refused a controller from " + p.peer + " speaking protocol v" + std::to_string(theirs) +
               " (this node speaks v" + std::to_string(kNodeProtocolVersion) + ")";
      });
    } else {
      Bytes32 client_nonce{}, client_proof{};
      std::memcpy(client_nonce.data(), h + 8, 32);
      std::memcpy(client_proof.data(), h + 40, 32);
      const Bytes32 expected = proof(options.secret, "hyflow-node-client", p.nonce, client_nonce);
      if (!options.secret.empty() && !crypto::equal_in_constant_time(expected.data(), client_proof.data(), 32)) {
        reply[0] = kStatusSecret;
        count(&FrontDoorStats::wrong_secret);
        log->note("failed authentications", p.peer, [&] {
          return "wrong shared secret from " + p.peer + ", connection refused (more in the next " +
                 std::to_string(options.log_window.count() / 1000) + " s are counted, then summarized)";
        });
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
      const auto next_summary = log->flush(Clock::now());
      if (next_summary != Clock::time_point::max()) timeout = net::remaining_ms(next_summary);
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
        if (now >= p.deadline) {  // the whole handshake's deadline, however many bytes came
          turn_away(p, kStatusTimeout);
          count(&FrontDoorStats::timed_out);
          log->note("handshakes timed out", p.peer, [&] {
            return "a handshake from " + p.peer + " timed out after " +
                   std::to_string(options.handshake_timeout.count()) + " ms (" + std::to_string(p.got) + " of " +
                   std::to_string(kHelloBytes) + " bytes of its hello)";
          });
          continue;
        }
        still.push_back(std::move(p));
      }
      pending.swap(still);
      if (rc > 0 && fds[1].revents) accept_some();
    }
    pending.clear();  // closes them
    log->flush_all();
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
  im.log.emplace("front door", im.options.log_window);
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

namespace {

/// The node turned this handshake away for a reason that passes (its door was full, it timed
/// the handshake out): another attempt may succeed.
struct DoorBusy {
  std::string why;
};

/// One attempt of the handshake, within `deadline`. Throws DoorBusy or ClusterError.
int connect_once(const std::string& host, int port, const std::string& secret, bool tls,
                 std::chrono::milliseconds timeout, Clock::time_point deadline) {
  const std::string where = host + ":" + std::to_string(port);
  const net::Timeouts limits{.each_wait = timeout, .deadline = deadline};
  auto fail = [&](const std::string& why) -> ClusterError {
    return ClusterError("cannot connect to node " + where + ": " + why);
  };
  net::Fd fd;
  try {
    fd = net::connect_tcp(host, port, limits);
  } catch (const net::NetError& e) {
    throw fail(e.what());
  }
  unsigned char greeting[kGreetingBytes];
  try {
    net::read_all(fd.get(), greeting, sizeof greeting, limits);
  } catch (const net::NetError& e) {
    if (e.kind() == net::NetError::Kind::closed && e.transferred() == 0)
      throw DoorBusy{"the node closed the connection before its greeting (" + std::string(e.what()) +
                     "): its front door is full or out of file descriptors, or this is not a caf-node"};
    if (e.kind() == net::NetError::Kind::timed_out)
      throw fail("no node greeting (" + std::string(e.what()) +
                 "): the node's front door did not answer in time (an overloaded host or door), or this is "
                 "not a caf-node");
    throw fail("no complete node greeting (" + std::string(e.what()) + "): is this a caf-node?");
  }
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
  unsigned char reply[kReplyBytes];
  try {
    net::write_all(fd.get(), hello, sizeof hello, limits);
    net::read_all(fd.get(), reply, sizeof reply, limits);
  } catch (const net::NetError& e) {
    // Evicted while the hello was on its way: the node's answer (status 3) can be lost to the reset.
    if (e.kind() == net::NetError::Kind::closed && e.transferred() == 0)
      throw DoorBusy{"the node closed the connection during the handshake (" + std::string(e.what()) +
                     "): its front door is full"};
    throw fail("no answer to the hello (" + std::string(e.what()) + ")");
  }
  if (reply[0] == kStatusBusy)
    throw DoorBusy{"the node's front door is full: it evicted this handshake to admit newer connections (too many "
                   "unfinished handshakes from this address, or in all: a flood?)"};
  if (reply[0] == kStatusTimeout)
    throw DoorBusy{"the node timed this handshake out (its whole handshake has a deadline)"};
  if (reply[0] == kStatusSecret)
    throw fail("authentication failed: the controller's shared secret does not match this node's");
  if (reply[0] == kStatusVersion)
    throw fail("the node refused the hello: protocol version mismatch (this controller speaks v" +
               std::to_string(kNodeProtocolVersion) + ")");
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

}  // namespace

int front_door_connect(const std::string& host, int port, const std::string& secret, bool tls,
                       std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto backoff = std::chrono::milliseconds(10);
  for (int attempt = 1;; ++attempt) {
    std::string why;
    try {
      return connect_once(host, port, secret, tls, timeout, deadline);
    } catch (const DoorBusy& busy) {
      why = busy.why;
    }
    if (Clock::now() + backoff >= deadline) {
      const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      throw ClusterError("cannot connect to node " + host + ":" + std::to_string(port) + ": " + why + " (" +
                         std::to_string(attempt) + " attempt(s) in " + std::to_string(spent) + " ms)");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
  }
}

}  // namespace hyflow::cluster::detail
