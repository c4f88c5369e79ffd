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

#include <cstdio>
#include <cstring>
#include <fstream>
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

TEST_CASE("idle or flooding peers at the front door are timed out or turned away; the node keeps serving") {
  const std::string file = write_secret("flood", "correct horse battery staple");
  test::NodeProcess node({"--secret-file=" + file});
  // 40 silent connections from one address: at most 8 wait in the handshake, the rest are
  // closed at once.
  std::vector<int> fds;
  for (int i = 0; i < 40; ++i) fds.push_back(raw_connect(node.port()));
  int closed_at_once = 0;
  for (int fd : fds) {
    bool closed = false;
    const std::string got = read_until_closed(fd, 300ms, closed);
    if (closed && got.empty()) ++closed_at_once;
  }
  CHECK(closed_at_once >= 32);
  // The silent ones are dropped after the 5 s handshake timeout, freeing the door.
  int timed_out = 0;
  for (int fd : fds) {
    bool closed = false;
    read_until_closed(fd, 10s, closed);
    timed_out += closed ? 1 : 0;
    ::close(fd);
  }
  CHECK(timed_out == 40);
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
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
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
