// The rendezvous store under attack (issue 33, item 1): two ranks keep all-reducing on 127.0.0.1
// while a stranger probes the store without the group's token, holds half a request open, stalls
// many connections and claims a 1 GiB key. The job must not notice; the store must answer the
// stranger nothing, listen on the configured address only, and bound what it allocates.
#include <hyflow/core/error.hpp>
#include <hyflow/core/net.hpp>
#include <hyflow/parallel/process_group.hpp>
#include <hyflow/parallel/rendezvous_store.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

using namespace hyflow;
using namespace hyflow::parallel;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

/// A raw TCP connection of the stranger (-1 when refused).
int dial(const std::string& ip, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_bytes(int fd, const std::vector<uint8_t>& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;  // the store closed it: fine
    at += static_cast<size_t>(n);
  }
}

/// Everything the peer sends until it closes the connection or `bound` passes.
struct Received {
  std::vector<uint8_t> bytes;
  bool closed = false;
};
Received drain(int fd, std::chrono::milliseconds bound) {
  Received r;
  const auto end = Clock::now() + bound;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (left <= 0) return r;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    uint8_t buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      r.closed = true;
      return r;
    }
    r.bytes.insert(r.bytes.end(), buf, buf + n);
  }
}

/// c10d TCPStore's framing (what the stranger sent): a query type, then u64 lengths.
std::vector<uint8_t> c10d_header(uint8_t query, uint64_t length) {
  std::vector<uint8_t> out{query};
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(length >> (8 * i)));
  return out;
}

size_t resident_bytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<size_t>(resident) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

std::vector<uint8_t> hmac_proof(const std::string& token, const uint8_t* nonce) {
  std::vector<uint8_t> message{'h', 'y', 'f', 'l', 'o', 'w', '.', 's', 't', 'o', 'r', 'e', '.', 'v', '1'};
  message.insert(message.end(), nonce, nonce + 32);
  std::vector<uint8_t> out(32);
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message.data(), message.size(), out.data(), &len);
  return out;
}

/// Two ranks (threads) that all-reduce until told to stop, forming a sub-group (a store
/// rendezvous) whenever asked; every failure and wrong sum is recorded.
struct Job {
  int port = hyflow::pick_free_port();
  std::atomic<int> joined{0};
  std::atomic<bool> stop{false};
  std::atomic<int> subgroups_wanted{0};
  std::atomic<int> subgroups_done[2] = {0, 0};
  std::atomic<int> rounds[2] = {0, 0};
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> ranks;

  Job() {
    for (int r = 0; r < 2; ++r) ranks.emplace_back([this, r] { run(r); });
  }
  ~Job() {
    stop = true;
    for (auto& t : ranks) t.join();
  }
  void run(int r) {
    try {
      ProcessGroup pg(ProcessGroupOptions{
          .rank = r, .world_size = 2, .master_port = port, .store_token = "the job's token", .timeout = 20s});
      ++joined;
      int made = 0;
      for (;;) {
        // [rank + 1, stop, wants a sub-group]: the ranks agree on the round they leave at, and
        // on the round both form the sub-group (a rendezvous neither may enter alone)
        auto t = torch::tensor({float(r + 1), stop ? 1.f : 0.f, made < subgroups_wanted ? 1.f : 0.f});
        pg.all_reduce(t);
        if (t[0].item<float>() != 3.f) throw Error("wrong sum " + std::to_string(t[0].item<float>()));
        if (t[1].item<float>() > 0) break;
        ++rounds[r];
        if (t[2].item<float>() == 2.f) {
          auto sub = pg.new_subgroup({0, 1}, "sub" + std::to_string(made++));
          auto s = torch::full({1}, float(r + 1));
          sub->all_reduce(s);
          if (s[0].item<float>() != 3.f) throw Error("wrong sub-group sum");
          ++subgroups_done[r];
        }
        std::this_thread::sleep_for(20ms);
      }
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex);
      failures.push_back("rank " + std::to_string(r) + ": " + e.what());
      stop = true;
    }
  }
  /// Waits up to `bound` until both ranks did `n` more rounds than now.
  bool progresses(int n, std::chrono::milliseconds bound) {
    const int a = rounds[0] + n, b = rounds[1] + n;
    const auto end = Clock::now() + bound;
    while (Clock::now() < end && !stop) {
      if (rounds[0] >= a && rounds[1] >= b) return true;
      std::this_thread::sleep_for(10ms);
    }
    return rounds[0] >= a && rounds[1] >= b;
  }
};

}  // namespace

TEST_CASE("the rendezvous store listens on its address only and answers no stranger; the job runs on") {
  Job job;
  const auto start = Clock::now();
  while (job.joined.load() < 2 && !job.stop && Clock::now() - start < 20s) std::this_thread::sleep_for(10ms);
  REQUIRE(job.joined.load() == 2);
  REQUIRE(job.progresses(3, 5s));

  {
    // 127.0.0.2 is the loopback interface too: a store bound to every interface answers there
    const int fd = dial("127.0.0.2", job.port);
    CHECK(fd < 0);
    if (fd >= 0) ::close(fd);
  }

  // 1. GETNUMKEYS without a credential (c10d's query 6): no answer, the connection closed.
  {
    const int fd = dial("127.0.0.1", job.port);
    REQUIRE(fd >= 0);
    send_bytes(fd, {6});
    const auto got = drain(fd, 5s);
    ::close(fd);
    CHECK(got.closed);
    // only the store's greeting: "HFST", a version and a 32-byte nonce; never a key count
    CHECK(got.bytes.size() == 37);
    CHECK(std::string(got.bytes.begin(), got.bytes.begin() + std::min<size_t>(4, got.bytes.size())) == "HFST");
  }

  // 2 and 3. Half a SET held open, and 64 connections stalled one byte in, while the job
  // all-reduces and forms a sub-group through the store (the stall between two all-reduces).
  {
    std::vector<int> held;
    auto half_set = c10d_header(0, 10);
    half_set.push_back('k');
    for (int i = 0; i < 8; ++i) {
      held.push_back(dial("127.0.0.1", job.port));
      send_bytes(held.back(), half_set);
    }
    for (int i = 0; i < 64; ++i) {
      held.push_back(dial("127.0.0.1", job.port));
      send_bytes(held.back(), {0});
    }
    const auto before = job.subgroups_done[0].load();
    job.subgroups_wanted = 1;
    CHECK(job.progresses(20, 10s));
    CHECK(job.subgroups_done[0].load() == before + 1);
    CHECK(job.subgroups_done[1].load() == before + 1);
    // the store closed every stalled connection once its handshake time (3 s) was up
    for (int fd : held) {
      CHECK(drain(fd, 5s).closed);
      ::close(fd);
    }
  }

  // 4. A SET claiming a 1 GiB key, then 4 MiB of it: the store allocates nothing for it.
  {
    const size_t rss = resident_bytes();
    const int fd = dial("127.0.0.1", job.port);
    REQUIRE(fd >= 0);
    send_bytes(fd, c10d_header(0, uint64_t{1} << 30));
    send_bytes(fd, std::vector<uint8_t>(size_t{4} << 20, 'x'));
    CHECK(drain(fd, 5s).closed);
    ::close(fd);
    CHECK(resident_bytes() < rss + (size_t{64} << 20));
    CHECK(job.progresses(5, 5s));
  }

  // A client with another token is refused, naming the reason.
  CHECK_THROWS_WITH(RendezvousClient({.address = "127.0.0.1", .port = job.port, .token = "a guess", .timeout = 2s}),
                    Catch::Contains("refused this rank's proof") &&
                        Catch::Contains("127.0.0.1:" + std::to_string(job.port)));
  CHECK(job.progresses(3, 5s));

  job.stop = true;
  for (auto& t : job.ranks) t.join();
  job.ranks.clear();
  for (const auto& f : job.failures) FAIL_CHECK(f);
}

TEST_CASE("an authenticated peer's oversized or malformed request costs it its connection, not the store") {
  RendezvousServer server(
      {.address = "127.0.0.1", .token = "t", .handshake_timeout = 1000ms, .request_timeout = 1000ms});
  RendezvousClient good({.address = "127.0.0.1", .port = server.port(), .token = "t", .timeout = 2s});
  good.set("a", {1, 2, 3});
  CHECK(good.num_keys() == 1);

  // A raw peer that knows the token, as a confused or compromised rank would.
  auto authenticated = [&] {
    const int fd = dial("127.0.0.1", server.port());
    uint8_t greeting[37];
    size_t at = 0;
    while (at < sizeof(greeting)) {
      const ssize_t n = ::recv(fd, greeting + at, sizeof(greeting) - at, 0);
      REQUIRE(n > 0);
      at += static_cast<size_t>(n);
    }
    send_bytes(fd, hmac_proof("t", greeting + 5));
    uint8_t ok = 0;
    REQUIRE(::recv(fd, &ok, 1, 0) == 1);
    CHECK(ok == 1);
    return fd;
  };
  auto request_head = [](uint8_t op, uint32_t count, uint32_t first_len) {
    std::vector<uint8_t> out{op};
    for (uint32_t v : {count, first_len})
      for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
    return out;
  };
  const auto rejected = server.rejected_connections();
  SECTION("a 1 GiB key") {
    const int fd = authenticated();
    send_bytes(fd, request_head(1, 2, 1u << 30));
    CHECK(drain(fd, 3s).closed);
    ::close(fd);
  }
  SECTION("an unknown op") {
    const int fd = authenticated();
    send_bytes(fd, request_head(99, 0, 0));
    CHECK(drain(fd, 3s).closed);
    ::close(fd);
  }
  SECTION("four billion strings") {
    const int fd = authenticated();
    send_bytes(fd, request_head(4, 0xffffffffu, 1));
    CHECK(drain(fd, 3s).closed);
    ::close(fd);
  }
  SECTION("half a request held past the request deadline") {
    const int fd = authenticated();
    send_bytes(fd, request_head(1, 2, 5));
    const auto t0 = Clock::now();
    CHECK(drain(fd, 4s).closed);
    CHECK(Clock::now() - t0 >= 900ms);
    ::close(fd);
  }
  CHECK(server.rejected_connections() == rejected + 1);
  // the store and its good client are unharmed
  good.set("b", {4});
  CHECK(good.get("a") == std::vector<uint8_t>{1, 2, 3});
  CHECK(good.num_keys() == 2);
  CHECK_FALSE(good.wait({"never"}, 50ms));
  CHECK(good.add("n", 5) == 5);
  // an add past int64 costs the connection; the client's next request reconnects
  CHECK_THROWS_WITH(good.add("n", std::numeric_limits<int64_t>::max()),
                    Catch::Contains("add to 'n'") && Catch::Contains("closed the connection"));
  CHECK(good.add("n", 1) == 6);
  CHECK_THROWS_AS(good.set(std::string(5000, 'k'), {1}), ValueError);
}

TEST_CASE("a store client waits for a key another client sets; compare_set, erase and check behave as c10d's") {
  RendezvousServer server({.address = "127.0.0.1", .token = "t"});
  RendezvousClient a({.address = "127.0.0.1", .port = server.port(), .token = "t", .timeout = 2s});
  RendezvousClient b({.address = "127.0.0.1", .port = server.port(), .token = "t", .timeout = 2s});
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    b.set("late", {7});
  });
  CHECK(a.wait({"late"}, 5s));
  setter.join();
  CHECK(a.get("late") == std::vector<uint8_t>{7});
  CHECK(a.compare_set("late", {7}, {8}) == std::vector<uint8_t>{8});
  CHECK(a.compare_set("late", {7}, {9}) == std::vector<uint8_t>{8});
  CHECK(a.erase("late"));
  CHECK_FALSE(a.check({"late"}));
}
