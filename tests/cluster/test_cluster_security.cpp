// Multi-process: what a peer without the shared secret can do to a caf-node (nothing but the
// front door's handshake), driven as an attacker would: CAF's own client, raw BASP frames and
// hostile sizes, against a hyflow-test-node child on 127.0.0.1.
#include "node_process.hpp"
#include "test_workers.hpp"

#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/cluster/all.hpp>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

using namespace hyflow;
using namespace hyflow::cluster;
using namespace std::chrono_literals;

namespace {

std::string write_secret(const std::string& name, const std::string& secret) {
  std::string path = "/tmp/hyflow-cluster-sec-" + std::to_string(getpid()) + "-" + name;
  std::ofstream(path) << secret << "\n";
  return path;
}

/// A raw TCP connection to 127.0.0.1:port (blocking; every read below waits with poll).
int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

/// Reads what arrives within `timeout` until the peer closes; `closed` says whether it did.
std::string read_until_closed(int fd, std::chrono::milliseconds timeout, bool& closed) {
  std::string got;
  closed = false;
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return got;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      closed = true;
      return got;
    }
    got.append(buf, static_cast<size_t>(n));
  }
}

/// VmHWM (peak resident set) of a process in bytes, from /proc.
int64_t peak_rss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  FAIL("no VmHWM in /proc/" << pid << "/status");
  return 0;
}

/// A BASP 0.17 header (32 bytes, big-endian): a client handshake announcing `payload_len`
/// bytes of payload.
std::string basp_client_handshake_header(uint32_t payload_len) {
  unsigned char h[32] = {};
  h[0] = 1;  // message_type::client_handshake
  h[4] = static_cast<unsigned char>(payload_len >> 24);
  h[5] = static_cast<unsigned char>(payload_len >> 16);
  h[6] = static_cast<unsigned char>(payload_len >> 8);
  h[7] = static_cast<unsigned char>(payload_len);
  h[15] = 1;  // operation_data: nonzero (a version)
  return std::string(reinterpret_cast<char*>(h), sizeof h);
}

/// Exactly `n` bytes from `fd` within `timeout` (fewer when the peer closes or is too slow).
std::string read_exactly(int fd, size_t n, std::chrono::milliseconds timeout) {
  std::string got;
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (got.size() < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[256];
    ssize_t k = ::recv(fd, buf, std::min(sizeof buf, n - got.size()), 0);
    if (k <= 0) break;
    got.append(buf, static_cast<size_t>(k));
  }
  return got;
}

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string big_endian_u32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

/// A raw connection that passed the node's front door with `secret` (the controller's side of
/// the handshake, written out): what follows on it is BASP.
int authenticated_connection(int port, const std::string& secret) {
  int fd = raw_connect(port);
  const std::string greeting = read_exactly(fd, 41, 5s);
  REQUIRE(greeting.size() == 41);
  REQUIRE(greeting.substr(0, 4) == "HFND");
  const std::string node_nonce = greeting.substr(9, 32);
  const std::string my_nonce(32, 'c');
  const std::string proof = unhex(challenge_proof(secret, "hyflow-node-client" + node_nonce + my_nonce));
  const std::string hello = "HFCT" + big_endian_u32(kNodeProtocolVersion) + my_nonce + proof;
  REQUIRE(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) == 72);
  const std::string reply = read_exactly(fd, 33, 5s);
  REQUIRE(reply.size() == 33);
  REQUIRE(reply[0] == 0);  // admitted
  return fd;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

size_t count_lines_with(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos ? 1 : 0;
  return n;
}

/// A non-blocking connection to 127.0.0.1:port under way (or -1).
int open_nonblocking(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// From a thread: holds `slow` slow-loris connections (one byte of a hello a second each) and
/// `idle` half-open ones (nothing sent) to the node's door, reopening every one the node
/// closes (looked at every 50 ms), as an attacker keeping the door busy would.
class DoorAttacker {
 public:
  DoorAttacker(int port, int slow, int idle) : port_(port), slow_(slow), fds_(slow + idle, -1) {
    thread_ = std::thread([this] { run(); });
  }
  ~DoorAttacker() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  uint64_t reopened() const { return reopened_; }

 private:
  void run() {
    auto next_byte = std::chrono::steady_clock::now();
    while (!stop_) {
      for (int& fd : fds_) {
        if (fd >= 0) {
          char buf[128];
          const ssize_t k = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
          if (k > 0 || (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) continue;
          ::close(fd);  // the node closed it (evicted, timed out)
          ++reopened_;
        }
        fd = open_nonblocking(port_);
      }
      if (std::chrono::steady_clock::now() >= next_byte) {
        for (int i = 0; i < slow_; ++i)
          if (fds_[i] >= 0) ::send(fds_[i], "H", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        next_byte += 1s;
      }
      std::this_thread::sleep_for(50ms);
    }
  }
  int port_;
  int slow_;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> reopened_{0};
  std::thread thread_;
};

/// A listening socket on 127.0.0.1 that plays a node: `serve(fd)` runs for each connection.
class FakeNode {
 public:
  explicit FakeNode(std::function<void(int)> serve) : serve_(std::move(serve)) {
    const auto listener = test::listen_on_loopback(16);
    lfd_ = listener.fd;
    port_ = listener.port;
    thread_ = std::thread([this] {
      for (;;) {
        int c = ::accept(lfd_, nullptr, nullptr);
        if (c < 0) return;  // shut down
        ++connections_;
        serve_(c);
        ::close(c);
      }
    });
  }
  ~FakeNode() {
    ::shutdown(lfd_, SHUT_RDWR);
    thread_.join();
    ::close(lfd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_; }

 private:
  std::function<void(int)> serve_;
  int lfd_ = -1;
  int port_ = 0;
  std::atomic<int> connections_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE(
    "without the secret, CAF's client cannot connect to a node, so remote spawn and CAF's services are out "
    "of reach") {
  const std::string file = write_secret("spawn", "correct horse battery staple");
  test::NodeProcess node({"--secret-file=" + file});
  auto rt = test::network_runtime();
  {
    auto& sys = actors::caf_protocol::system_of(*rt);
    caf::scoped_actor self{sys};
    // The path of remote_actor, remote_spawn and remote_lookup ("SpawnServ", "ConfigServ"):
    // a BASP connection. It must not come about without the secret.
    std::string outcome;
    caf::node_id nid;
    self->request(sys.middleman().actor_handle(), 3s, caf::connect_atom::value, std::string("127.0.0.1"),
                  static_cast<uint16_t>(node.port()))
        .receive(
            [&](caf::node_id& n, caf::strong_actor_ptr&, std::set<std::string>&) {
              outcome = "connected";
              nid = n;
            },
            [&](caf::error& e) { outcome = "refused: " + sys.render(e); });
    INFO(outcome);
    if (outcome == "connected") {
      // What the attacker did next: CAF's spawn server creates a worker for anyone.
      auto w = sys.middleman().remote_spawn<actors::caf_protocol::worker_actor>(
          nid, "hyflow.worker", caf::make_message(), std::chrono::seconds(3));
      CHECK_FALSE(w);
      auto spawn_server = sys.middleman().remote_lookup(caf::atom("SpawnServ"), nid);
      auto config_server = sys.middleman().remote_lookup(caf::atom("ConfigServ"), nid);
      CHECK_FALSE(spawn_server);
      CHECK_FALSE(config_server);
    }
    CHECK(outcome.rfind("refused", 0) == 0);
  }
  rt.reset();
  std::remove(file.c_str());
}

TEST_CASE(
    "a node's first bytes are the front door's challenge, and BASP frames instead of the answer end the "
    "connection") {
  const std::string file = write_secret("basp", "correct horse battery staple");
  test::NodeProcess node({"--secret-file=" + file});
  int fd = raw_connect(node.port());
  // A BASP client handshake followed by a direct message to the named actor "SpawnServ": what
  // CAF's remote spawn sends once connected.
  std::string frames = basp_client_handshake_header(8) + std::string(8, '\0');
  std::string spawn = basp_client_handshake_header(0);
  spawn[0] = 2;  // message_type::direct_message
  frames += spawn;
  ::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL);
  bool closed = false;
  const std::string got = read_until_closed(fd, 10s, closed);
  ::close(fd);
  REQUIRE(got.size() >= 41);
  CHECK(got.substr(0, 4) == "HFND");  // the greeting (magic, version, flags, nonce), not BASP
  CHECK(got[8] == 1);                 // flags: this node requires the secret
  CHECK(closed);                      // refused: status, then the node closed the connection
  CHECK(got.size() == 41 + 33);
  CHECK(got[41] != 0);  // status is not "ok"
  std::remove(file.c_str());
}

TEST_CASE("a 32-byte BASP header claiming 1 GiB does not make a node allocate it") {
  const std::string file = write_secret("rss", "correct horse battery staple");
  test::NodeProcess node({"--secret-file=" + file});
  const int64_t before = peak_rss(node.pid());
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {
    int fd = raw_connect(node.port());
    // 72 bytes: what the front door reads; a BASP server would read the first 32 as a header
    // and then wait for (and allocate) the gigabyte it announces.
    std::string frames = basp_client_handshake_header(uint32_t{1} << 30) + std::string(40, '\0');
    ::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL);
    fds.push_back(fd);
  }
  int refused = 0;
  for (int fd : fds) {
    bool closed = false;
    read_until_closed(fd, 3s, closed);
    refused += closed ? 1 : 0;
    ::close(fd);
  }
  const int64_t after = peak_rss(node.pid());
  INFO("peak RSS before " << before / (1 << 20) << " MiB, after " << after / (1 << 20) << " MiB");
  CHECK(after - before < (int64_t{64} << 20));
  CHECK(refused == 2);
  std::remove(file.c_str());
}

TEST_CASE("idle peers at the front door are evicted oldest first or timed out, with a status; the node serves") {
  const std::string file = write_secret("flood", "correct horse battery staple");
  test::NodeProcess node({"--secret-file=" + file});
  // 40 silent connections from one address: at most 32 wait in the handshake; each newer one
  // evicts the oldest (greeting, then status 3 "door full", then closed).
  std::vector<int> fds;
  for (int i = 0; i < 40; ++i) fds.push_back(raw_connect(node.port()));
  std::vector<std::string> got(fds.size());
  std::vector<bool> closed(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) {
    bool c = false;
    got[i] = read_until_closed(fds[i], i < 8 ? 3000ms : 100ms, c);
    closed[i] = c;
  }
  for (size_t i = 0; i < 8; ++i) {
    INFO("connection " << i);
    CHECK(closed[i]);
    REQUIRE(got[i].size() == 41 + 33);
    CHECK(got[i][41] == 3);
  }
  for (size_t i = 8; i < fds.size(); ++i) CHECK_FALSE(closed[i]);
  // The others are dropped after the whole handshake's 5 s deadline (status 4), freeing the door.
  int timed_out = 0;
  for (size_t i = 8; i < fds.size(); ++i) {
    bool c = false;
    const std::string all = got[i] + read_until_closed(fds[i], 10s, c);
    timed_out += c && all.size() == 41 + 33 && all[41] == 4 ? 1 : 0;
  }
  for (int fd : fds) ::close(fd);
  CHECK(timed_out == 32);
  auto rt = test::network_runtime();
  {
    test::register_test_workers();
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}, .secret = read_secret_file(file)});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
    std::vector<std::string> who = wg.call(&test::EchoWorker::whoami);
    CHECK(who == std::vector<std::string>{"rank 0/1"});
  }
  rt.reset();
  std::remove(file.c_str());
}

TEST_CASE("a peer that is not a caf-node of this protocol version gets a ClusterError naming it and the versions") {
  // A fake node that greets with protocol v99.
  const auto listener = test::listen_on_loopback(4);
  const int lfd = listener.fd;
  const int port = listener.port;
  std::thread fake([lfd] {
    int c = ::accept(lfd, nullptr, nullptr);
    if (c < 0) return;
    unsigned char greeting[41] = {'H', 'F', 'N', 'D', 0, 0, 0, 99, 0};
    ::send(c, greeting, sizeof greeting, MSG_NOSIGNAL);
    bool closed = false;
    read_until_closed(c, 5s, closed);
    ::close(c);
  });
  auto rt = test::network_runtime();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  try {
    RemoteLauncher::connect(*rt, {.nodes = {addr}});
    FAIL("expected a ClusterError");
  } catch (const ClusterError& e) {
    CHECK_THAT(e.what(), Catch::Contains(addr) && Catch::Contains("protocol version mismatch: node speaks v99") &&
                             Catch::Contains("controller v" + std::to_string(kNodeProtocolVersion)));
  }
  fake.join();
  ::close(lfd);
  rt.reset();
  // And a node answers a hello of another version with a refusal, then closes.
  test::NodeProcess node;
  int fd = raw_connect(node.port());
  unsigned char hello[72] = {'H', 'F', 'C', 'T', 0, 0, 0, 99};
  ::send(fd, hello, sizeof hello, MSG_NOSIGNAL);
  bool closed = false;
  const std::string got = read_until_closed(fd, 10s, closed);
  ::close(fd);
  REQUIRE(got.size() == 41 + 33);
  CHECK(got[8] == 0);   // flags: this node has no secret
  CHECK(got[41] == 1);  // status: version mismatch
  CHECK(closed);
}

TEST_CASE("a controller connects in < 1 s, 20 of 20, while 32 slow-loris and 200 half-open connections are held") {
  const std::string file = write_secret("loris", "correct horse battery staple");
  test::NodeProcess node({"--secret-file=" + file});
  test::register_test_workers();
  DoorAttacker attack(node.port(), 32, 200);
  std::this_thread::sleep_for(500ms);  // every slot of the door is the attacker's now
  std::vector<std::string> failures;
  std::vector<double> seconds;
  for (int i = 0; i < 20; ++i) {
    auto rt = test::network_runtime();
    const auto start = std::chrono::steady_clock::now();
    try {
      auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}, .secret = read_secret_file(file)});
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (i == 19) {  // and it is served: a worker answers
        rt->set_launcher(cluster);
        WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
        std::vector<std::string> who = wg.call(&test::EchoWorker::whoami);
        CHECK(who == std::vector<std::string>{"rank 0/1"});
      }
    } catch (const ClusterError& e) {
      failures.push_back(e.what());
    }
    rt.reset();
    std::this_thread::sleep_for(250ms);  // 20 attempts over > 5 s: across a wave of handshake deadlines
  }
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
  REQUIRE(seconds.size() == 20);
  CHECK(*std::max_element(seconds.begin(), seconds.end()) < 1.0);
  CHECK(attack.reopened() > 200);  // the door turned the attackers' connections away meanwhile
  std::remove(file.c_str());
}

TEST_CASE("a controller turned away by a full door tries again, then says so (not a version mismatch)") {
  auto rt = test::network_runtime();
  SECTION("the node closes the connection before its greeting") {
    FakeNode fake([](int) {});
    try {
      RemoteLauncher::connect(*rt, {.nodes = {fake.address()}, .connect_timeout = 600ms});
      FAIL("expected a ClusterError");
    } catch (const ClusterError& e) {
      CHECK_THAT(e.what(), Catch::Contains(fake.address()) &&
                               Catch::Contains("closed the connection before its greeting") &&
                               Catch::Contains("front door is full") && !Catch::Contains("version"));
    }
    CHECK(fake.connections() >= 2);
  }
  SECTION("the node evicts the handshake (status 3)") {
    FakeNode fake([](int fd) {
      std::string greeting = "HFND" + big_endian_u32(kNodeProtocolVersion) + std::string(1 + 32, '\0');
      ::send(fd, greeting.data(), greeting.size(), MSG_NOSIGNAL);
      read_exactly(fd, 72, 2s);
      const std::string reply = "\x03" + std::string(32, '\0');
      ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    });
    try {
      RemoteLauncher::connect(*rt, {.nodes = {fake.address()}, .connect_timeout = 600ms});
      FAIL("expected a ClusterError");
    } catch (const ClusterError& e) {
      CHECK_THAT(e.what(), Catch::Contains(fake.address()) && Catch::Contains("front door is full") &&
                               Catch::Contains("evicted this handshake") && !Catch::Contains("version"));
    }
    CHECK(fake.connections() >= 2);
  }
}

TEST_CASE("wrong-secret attempts are logged once per address and window, then summarized with a count") {
  const std::string file = write_secret("lograte", "correct horse battery staple");
  const std::string log = "/tmp/hyflow-cluster-sec-" + std::to_string(getpid()) + "-lograte.log";
  test::NodeProcess node({"--secret-file=" + file}, {.stderr_file = log});
  for (int i = 0; i < 100; ++i) {
    int fd = raw_connect(node.port());
    REQUIRE(read_exactly(fd, 41, 5s).size() == 41);
    const std::string hello = "HFCT" + big_endian_u32(kNodeProtocolVersion) + std::string(64, 'x');
    ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    const std::string reply = read_exactly(fd, 33, 5s);
    REQUIRE(reply.size() == 33);
    CHECK(reply[0] == 2);  // wrong secret
    ::close(fd);
  }
  node.signal(SIGTERM);  // the door's last summary is written when it closes
  int status = 0;
  REQUIRE(node.wait_exit(10s, status));
  const std::string text = read_file(log);
  INFO(text);
  CHECK(count_lines_with(text, "wrong shared secret") == 1);
  CHECK(count_lines_with(text, "99 more failed authentications from 127.0.0.1 in the last") == 1);
  std::remove(log.c_str());
  std::remove(file.c_str());
}

namespace {
/// VmSize (address space) of a process in bytes, from /proc.
uint64_t address_space(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  return 0;
}
}  // namespace

TEST_CASE("an authenticated peer's 4 GiB BASP header closes its connection, logged; the node stays up and serves") {
  const std::string secret = "correct horse battery staple";
  const std::string file = write_secret("huge", secret);
  const std::string log = "/tmp/hyflow-cluster-sec-" + std::to_string(getpid()) + "-huge.log";
  // Heartbeats off on both ends: nothing but the bound closes the attacker's connection.
  const std::vector<std::string> flags{"--secret-file=" + file, "--heartbeat-ms=0", "--connection-timeout-ms=0"};
  // The limit: the node's own address space plus 2 GiB (less than the 4 GiB it would need).
  uint64_t limit = 0;
  {
    test::NodeProcess probe(flags);
    limit = address_space(probe.pid()) + (uint64_t{2} << 30);
  }
  REQUIRE(limit > (uint64_t{2} << 30));
  std::string expected_line;
  std::vector<std::string> args = flags;
  SECTION("over the node's largest message (2 GiB by default): refused before any allocation") {
    expected_line = "announces 4294967295 bytes, more than the limit of 2147483648";
  }
  SECTION("under a raised largest message (4 GiB): the allocation fails, and only the connection pays") {
    args.push_back("--max-message-mb=4096");
    expected_line = "cannot allocate 4294967295 bytes for a CAF message from 127.0.0.1:";
  }
  test::NodeProcess node(args, {.stderr_file = log, .address_space_limit = limit});
  int fd = authenticated_connection(node.port(), secret);
  const std::string header = basp_client_handshake_header(0xffffffffu);
  REQUIRE(::send(fd, header.data(), header.size(), MSG_NOSIGNAL) == 32);
  bool closed = false;
  read_until_closed(fd, 5s, closed);
  ::close(fd);
  CHECK(closed);
  int status = 0;
  REQUIRE_FALSE(node.wait_exit(200ms, status));  // still running
  {
    hyflow::RuntimeOptions o;
    o.network = true;
    o.heartbeat_interval_ms = 0;
    o.connection_timeout_ms = 0;
    hyflow::Runtime rt(o);
    test::register_test_workers();
    auto cluster = RemoteLauncher::connect(rt, {.nodes = {node.address()}, .secret = secret});
    rt.set_launcher(cluster);
    WorkerGroup wg(rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
    std::vector<std::string> who = wg.call(&test::EchoWorker::whoami);
    CHECK(who == std::vector<std::string>{"rank 0/1"});
  }
  node.signal(SIGTERM);
  REQUIRE(node.wait_exit(10s, status));
  const std::string text = read_file(log);
  INFO(text);
  CHECK(count_lines_with(text, expected_line) == 1);
  std::remove(log.c_str());
  std::remove(file.c_str());
}
