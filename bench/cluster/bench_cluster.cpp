// Cluster figures (JSON lines, design brief §5), controller <-> one worker on a caf-node child
// over 127.0.0.1, each against a plain TCP peer measured in the same run (each repetition runs
// ours, then the peer, so that both see the same load):
//  - no-op call latency (median and p99) against a raw TCP ping-pong of a small message;
//  - a 64 MiB DataProto controller -> worker (the worker answers its size) and worker ->
//    controller, in MB/s, against a plain TCP socket moving the same bytes to and from another
//    process (this binary started again with --raw-peer).
//
// Usage: bench_cluster [--reps N] [--calls N] [--mode inline|plane|both]
//   inline: the caf-node and the controller send every DataProto inside the CAF messages
//           (HYFLOW_DATA_PLANE=off in both processes);
//   plane:  large DataProtos go over the data plane (the default);
//   both:   one after the other (default).
#include "bench_json.hpp"

#include "bench_workers.hpp"
#include "node_process.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/cluster/all.hpp>
#include <hyflow/cluster/data_plane.hpp>

#include <torch/torch.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

using namespace hyflow;
using namespace hyflow::cluster;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kPingBytes = 64;
constexpr int64_t kBulkBytes = int64_t{64} << 20;

[[noreturn]] void die(const std::string& what) {
  std::cerr << "bench_cluster: " << what << std::endl;
  std::exit(1);
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die(std::string("raw peer: send failed: ") + std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

/// false when the peer closed before the first byte.
bool read_all(int fd, char* p, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t k = ::recv(fd, p + done, n - done, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 && done == 0) return false;
    if (k <= 0) die("raw peer: short read");
    done += static_cast<size_t>(k);
  }
  return true;
}

void nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// ---- the raw TCP peer (a second process) ------------------------------------------------------
// One connection at a time; the first byte picks the exchange:
//   'p': echo kPingBytes messages until the client closes;
//   'u': repeatedly read u64 n + n bytes, answer u64 n;
//   'd': repeatedly read u64 n, answer n bytes.

int raw_peer_main() {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 4) != 0)
    die("raw peer: cannot listen");
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::cout << "raw peer listening on 127.0.0.1:" << ntohs(a.sin_port) << std::endl;
  std::vector<char> buf(static_cast<size_t>(kBulkBytes), 1);
  for (;;) {
    int c = ::accept(lfd, nullptr, nullptr);
    if (c < 0) continue;
    nodelay(c);
    char kind = 0;
    if (!read_all(c, &kind, 1) || kind == 'q') {
      ::close(c);
      if (kind == 'q') return 0;
      continue;
    }
    for (;;) {
      if (kind == 'p') {
        char msg[kPingBytes];
        if (!read_all(c, msg, sizeof msg)) break;
        write_all(c, msg, sizeof msg);
      } else {
        uint64_t n = 0;
        if (!read_all(c, reinterpret_cast<char*>(&n), 8)) break;
        if (n > buf.size()) buf.resize(n);
        if (kind == 'u') {
          if (!read_all(c, buf.data(), n)) die("raw peer: short upload");
          write_all(c, reinterpret_cast<char*>(&n), 8);
        } else {
          write_all(c, buf.data(), n);
        }
      }
    }
    ::close(c);
  }
}

/// Starts this binary again as the raw peer; its port comes from its first stdout line.
class RawPeer {
 public:
  RawPeer() {
    int out[2];
    if (pipe(out) != 0) die("pipe failed");
    std::string self = "/proc/self/exe", flag = "--raw-peer";
    char* argv[] = {self.data(), flag.data(), nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    if (posix_spawn(&pid_, "/proc/self/exe", &fa, nullptr, argv, environ) != 0) die("cannot start the raw peer");
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    std::string line;
    char ch;
    while (read(out[0], &ch, 1) == 1 && ch != '\n') line += ch;
    close(out[0]);
    auto colon = line.rfind(':');
    if (colon == std::string::npos) die("raw peer did not report its port: " + line);
    port_ = std::stoi(line.substr(colon + 1));
  }
  ~RawPeer() {
    int fd = open('q');
    ::close(fd);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  int open(char kind) const {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("cannot connect to the raw peer");
    nodelay(fd);
    write_all(fd, &kind, 1);
    return fd;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// ---- measuring ----------------------------------------------------------------------------------

double quantile(const std::vector<double>& sorted, double q) {
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * static_cast<double>(sorted.size())))];
}

using hyflow_bench::emit;

/// A plain TCP connection to the raw peer for one kind of exchange.
class RawLink {
 public:
  RawLink(const RawPeer& peer, char kind) : fd_(peer.open(kind)), buf_(static_cast<size_t>(kBulkBytes), 7) {}
  ~RawLink() { ::close(fd_); }
  void ping() {
    write_all(fd_, buf_.data(), kPingBytes);
    read_all(fd_, buf_.data(), kPingBytes);
  }
  void upload() {
    uint64_t n = buf_.size(), ack = 0;
    write_all(fd_, reinterpret_cast<char*>(&n), 8);
    write_all(fd_, buf_.data(), n);
    read_all(fd_, reinterpret_cast<char*>(&ack), 8);
  }
  void download() {
    uint64_t n = buf_.size();
    write_all(fd_, reinterpret_cast<char*>(&n), 8);
    read_all(fd_, buf_.data(), n);
  }

 private:
  int fd_;
  std::vector<char> buf_;
};

/// Runs `ours` and `raw` alternately `reps` times after `warmup` rounds (so that both see the
/// same machine load); medians and p99 in microseconds.
struct Paired {
  std::vector<double> ours, raw;
};
template <class A, class B>
Paired paired(int warmup, int reps, A&& ours, B&& raw) {
  for (int i = 0; i < warmup; ++i) {
    ours();
    raw();
  }
  Paired p;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    ours();
    auto t1 = Clock::now();
    raw();
    auto t2 = Clock::now();
    p.ours.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    p.raw.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  std::sort(p.ours.begin(), p.ours.end());
  std::sort(p.raw.begin(), p.raw.end());
  return p;
}

struct Figures {
  Paired noop, upload, download;
};

/// One caf-node child hosting one ClusterBenchWorker; `plane` picks how DataProtos travel.
Figures measure(const RawPeer& peer, int calls, int reps, bool plane) {
  // The child inherits the environment: this switches its data plane as well as ours.
  ::setenv("HYFLOW_DATA_PLANE", plane ? "on" : "off", 1);
  DataPlane::configure(DataPlaneOptions::from_environment());
  test::NodeProcess node;
  Figures f;
  auto rt = std::make_unique<Runtime>(RuntimeOptions{.network = true});
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"ClusterBenchWorker", Json::object()});
    {
      RawLink link(peer, 'p');
      f.noop = paired(200, calls, [&] { wg.call("noop"); }, [&] { link.ping(); });
    }
    DataProto batch(TensorDict{{"x", torch::rand({16, kBulkBytes / 4 / 16})}});
    {
      RawLink link(peer, 'u');
      f.upload = paired(
          2, reps,
          [&] {
            auto sizes = from_value<std::vector<int64_t>>(wg.call("nbytes", batch), "nbytes");
            if (sizes.size() != 1 || sizes[0] != kBulkBytes) die("nbytes answered a wrong size");
          },
          [&] { link.upload(); });
    }
    {
      RawLink link(peer, 'd');
      f.download = paired(
          2, reps,
          [&] {
            DataProto d = from_value<DataProto>(wg.call("make", Json(kBulkBytes)), "make");
            if (d.batch.at("x").numel() * 4 != kBulkBytes) die("make returned a wrong size");
          },
          [&] { link.download(); });
    }
  }
  rt.reset();
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10, calls = 2000;
  std::string mode = "both";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--raw-peer") return raw_peer_main();
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--calls" && i + 1 < argc) calls = std::atoi(argv[++i]);
    else if (a == "--mode" && i + 1 < argc) mode = argv[++i];
    else die("usage: bench_cluster [--reps N] [--calls N] [--mode inline|plane|both]");
  }
  if (reps < 1 || calls < 100 || (mode != "inline" && mode != "plane" && mode != "both"))
    die("--reps must be >= 1, --calls >= 100, --mode inline|plane|both");

  RawPeer peer;
  const double bytes = static_cast<double>(kBulkBytes);  // bytes/us == MB/s
  const std::string raw_bulk = "plain TCP socket between 2 processes, same bytes, alternating with ours (median)";
  std::vector<std::pair<std::string, bool>> runs;
  if (mode != "plane") runs.emplace_back("CAF messages", false);
  if (mode != "inline") runs.emplace_back("data plane", true);
  for (const auto& [label, plane] : runs) {
    const Figures f = measure(peer, calls, reps, plane);
    const std::string n = std::to_string(calls);
    const double med = quantile(f.noop.ours, 0.5), p99 = quantile(f.noop.ours, 0.99);
    const double raw_med = quantile(f.noop.raw, 0.5), raw_p99 = quantile(f.noop.raw, 0.99);
    emit("cluster_call_latency",
         "no-op call, 1 worker on a caf-node over 127.0.0.1, " + label + " (median of " + n + ")", med, "us",
         "raw TCP ping-pong of 64 bytes between 2 processes (median)", raw_med, raw_med / med);
    emit("cluster_call_latency", "no-op call, 1 worker on a caf-node over 127.0.0.1, " + label + " (p99 of " + n + ")",
         p99, "us", "raw TCP ping-pong of 64 bytes between 2 processes (p99)", raw_p99, raw_p99 / p99);
    const std::string r = std::to_string(reps);
    const double up = bytes / quantile(f.upload.ours, 0.5), raw_up = bytes / quantile(f.upload.raw, 0.5);
    const double down = bytes / quantile(f.download.ours, 0.5), raw_down = bytes / quantile(f.download.raw, 0.5);
    emit("cluster_transfer", "64 MiB DataProto controller -> worker, " + label + " (median of " + r + ")", up, "MB/s",
         raw_bulk, raw_up, up / raw_up);
    emit("cluster_transfer", "64 MiB DataProto worker -> controller, " + label + " (median of " + r + ")", down, "MB/s",
         raw_bulk, raw_down, down / raw_down);
  }
  return 0;
}
