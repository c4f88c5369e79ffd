// The data plane: its TCP server and client in this process, then large DataProtos between the
// controller and a caf-node child (which inherits this process's environment).
#include "node_process.hpp"
#include "test_workers.hpp"

#include <hyflow/cluster/all.hpp>
#include <hyflow/actors/payload_transfer.hpp>
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/dataproto/serialization.hpp>

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <future>
#include <thread>

using namespace hyflow;
using namespace hyflow::cluster;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

std::vector<char> pattern(size_t n) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + 7) & 0xff);
  return v;
}

/// A listening socket on 127.0.0.1 whose behaviour a test scripts (a misbehaving holder).
class FakeHolder {
 public:
  FakeHolder() {
    const auto listener = test::listen_on_loopback(4);
    fd_ = listener.fd;
    port_ = listener.port;
  }
  ~FakeHolder() {
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  /// Accepts one connection, reads the 37-byte request, then runs `then(fd)` and closes.
  template <class F>
  void serve_once(F then) {
    thread_ = std::thread([this, then] {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char req[37];
      size_t got = 0;
      while (got < sizeof req) {
        ssize_t k = ::recv(c, req + got, sizeof req - got, 0);
        if (k <= 0) break;
        got += static_cast<size_t>(k);
      }
      then(c);
      ::close(c);
    });
  }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

ObjectRef ref_to(int port, uint64_t size) {
  return ObjectRef{"127.0.0.1", port, "00112233445566778899aabbccddeeff", size};
}

DataProto big_batch(int64_t bytes) {
  torch::manual_seed(7);
  const int64_t rows = 16;
  DataProto d(TensorDict{{"x", torch::randn({rows, bytes / 4 / rows})},
                         {"ids", torch::arange(rows, torch::kInt64)}});
  d.meta_info = Json{{"temperature", 0.7}, {"tag", "big"}};
  return d;
}

void check_same(const DataProto& a, const DataProto& b) {
  REQUIRE(a.batch.keys() == b.batch.keys());
  for (const auto& k : a.batch.keys()) {
    const auto& x = a.batch.at(k);
    const auto& y = b.batch.at(k);
    REQUIRE(x.scalar_type() == y.scalar_type());
    REQUIRE(x.sizes() == y.sizes());
    // Bit for bit: compare the raw bytes, not the values.
    REQUIRE(std::memcmp(x.contiguous().data_ptr(), y.contiguous().data_ptr(), x.nbytes()) == 0);
  }
  CHECK(a.meta_info == b.meta_info);
}

/// Sets an environment variable for the caf-node children started in its scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

}  // namespace

// ---- the plane in one process -----------------------------------------------------------------

namespace {
/// A plain TCP connection to 127.0.0.1:port that sends nothing.
int idle_connection(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}
}  // namespace

TEST_CASE("300 idle connections to a data server do not keep a fetch from being served; they are closed later") {
  DataPlaneOptions o;
  o.token = data_plane_token("cluster secret");
  o.request_timeout = 500ms;
  DataPlane plane(o);
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(idle_connection(plane.port()));
  auto ref = plane.put(pattern(1000));
  CHECK(DataPlane::fetch(ref, 2s, o.token) == pattern(1000));
  // The idle ones never said what they want: closed after request_timeout (or to make room).
  for (int fd : idle) {
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);
    char c;
    CHECK(::recv(fd, &c, 1, 0) <= 0);
    ::close(fd);
  }
  CHECK(plane.stats().timed_out == 300);
  CHECK(plane.stats().fetched == 1);
}

TEST_CASE("churn on a data port fails no fetch: complete requests stay, one dropped unanswered is sent again") {
  DataPlaneOptions o;
  o.token = data_plane_token("cluster secret");
  DataPlane plane(o);
  const std::string job = job_data_plane_token(o.token, "job-churn");
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> churned{0};
  std::vector<std::thread> churners;
  for (int t = 0; t < 2; ++t)
    churners.emplace_back([&] {
      // Each keeps its last 200 connections open (the server's 256 slots stay full), some with
      // a few bytes of a request that never completes, and drops the oldest for every new one.
      std::deque<int> held;
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(plane.port()));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      for (uint64_t i = 0; !stop; ++i) {
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
          ::close(fd);
          std::this_thread::sleep_for(1ms);
          continue;
        }
        if (i % 4 == 0) ::send(fd, "HFOB", 4, MSG_NOSIGNAL | MSG_DONTWAIT);
        held.push_back(fd);
        ++churned;
        if (held.size() > 200) {
          ::close(held.front());
          held.pop_front();
        }
      }
      for (int fd : held) ::close(fd);
    });
  std::vector<std::string> failures;
  int fetched = 0;
  const auto end = Clock::now() + 3s;
  while (Clock::now() < end) {
    auto ref = plane.put(pattern(4096), true, job);
    try {
      const std::vector<char> got = DataPlane::fetch(ref, 5s, job);
      CHECK(got == pattern(4096));
      ++fetched;
    } catch (const DataPlaneError& e) {
      failures.push_back(e.what());
      plane.release(ref.id);
    }
  }
  stop = true;
  for (auto& t : churners) t.join();
  INFO(churned.load() << " connections churned, " << fetched << " fetched, " << failures.size() << " failed");
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
  CHECK(fetched >= 5);
  CHECK(churned.load() > 3000);
}

TEST_CASE("a request without the cluster's data plane token is refused with a reply naming the holder and why") {
  DataPlaneOptions o;
  o.token = data_plane_token("cluster secret");
  DataPlane plane(o);
  auto ref = plane.put(pattern(100));
  const std::string holder = "127.0.0.1:" + std::to_string(plane.port());
  CHECK_THROWS_WITH(DataPlane::fetch(ref, 2s, data_plane_token("another secret")),
                    Catch::Contains(holder) && Catch::Contains("wrong data plane token"));
  CHECK_THROWS_WITH(DataPlane::fetch(ref, 2s, ""), Catch::Contains("wrong data plane token"));
  CHECK(plane.held() == 1);  // the object is still there for the rightful fetcher
  CHECK(plane.stats().refused == 2);
  CHECK(DataPlane::fetch(ref, 2s, o.token) == pattern(100));
  // The token is derived from the secret: the same for every process of a cluster, 128 bits.
  CHECK(data_plane_token("cluster secret") == o.token);
  CHECK(data_plane_token("cluster secret").size() == 32);
  CHECK(data_plane_token("").empty());
  CHECK_THROWS_AS(plane.require_token("not hex"), ValueError);
}

TEST_CASE("an object stored for a job is served only with that job's token; other tokens neither get nor free it") {
  DataPlaneOptions o;
  o.token = data_plane_token("cluster secret");
  DataPlane plane(o);
  const std::string job_a = job_data_plane_token(o.token, "job-a"), job_b = job_data_plane_token(o.token, "job-b");
  const std::string holder = "127.0.0.1:" + std::to_string(plane.port());
  auto ref = plane.put(pattern(100), true, job_a);
  // A job this server holds nothing for is refused at the door, before a thread serves it.
  CHECK_THROWS_WITH(DataPlane::fetch(ref, 2s, job_b),
                    Catch::Contains(holder) && Catch::Contains("wrong data plane token"));
  // The cluster's token passes the door but is not this object's key.
  CHECK_THROWS_WITH(DataPlane::fetch(ref, 2s, o.token), Catch::Contains("another job"));
  CHECK_FALSE(DataPlane::discard(ref, 2s, o.token));
  // Once job b has objects here its token passes the door; job a's object still refuses it.
  auto ref_b = plane.put(pattern(10), true, job_b);
  CHECK_THROWS_WITH(DataPlane::fetch(ref, 2s, job_b), Catch::Contains("wrong data plane token"));
  CHECK_FALSE(DataPlane::discard(ref, 2s, job_b));
  CHECK(plane.held() == 2);  // nothing was handed out or freed by the refusals
  CHECK(DataPlane::fetch(ref, 2s, job_a) == pattern(100));
  // An object stored without a job needs the cluster's token, not a job's.
  auto plain = plane.put(pattern(20));
  CHECK_THROWS_WITH(DataPlane::fetch(plain, 2s, job_b), Catch::Contains("wrong data plane token"));
  CHECK(DataPlane::fetch(plain, 2s, o.token) == pattern(20));
  CHECK(DataPlane::discard(ref_b, 2s, job_b));
  CHECK(plane.held() == 0);
  CHECK(plane.stats().refused == 6);
  CHECK_THROWS_AS(plane.put(pattern(1), true, "not hex"), ValueError);
}

TEST_CASE("a job's data plane token is derived from the cluster token and the job id") {
  const std::string cluster = data_plane_token("cluster secret");
  const std::string a = job_data_plane_token(cluster, "job-a");
  CHECK(a.size() == 32);
  CHECK(a == job_data_plane_token(cluster, "job-a"));
  CHECK(a != job_data_plane_token(cluster, "job-b"));
  CHECK(a != job_data_plane_token(data_plane_token("another secret"), "job-a"));
  CHECK(a != cluster);
  CHECK(job_data_plane_token("", "job-a").empty());  // a cluster without a secret checks nothing
  CHECK_THROWS_AS(job_data_plane_token(cluster, ""), ValueError);
  CHECK_THROWS_AS(job_data_plane_token(cluster, std::string(129, 'x')), ValueError);
  CHECK(new_job_id().size() == 32);
  CHECK(new_job_id() != new_job_id());
}

TEST_CASE("the runtime's transfer stores a call's objects under its job: another job's import is refused") {
  install_data_plane();
  DataPlane::set_process_token(data_plane_token("transfer secret"));
  auto transfer = actors::payload_transfer();
  REQUIRE(transfer);
  const DataProto batch(TensorDict{{"x", torch::arange(int64_t{1} << 19, torch::kFloat32).reshape({512, 1024})}});
  std::vector<Value> values{Value(batch)};
  DataPlaneOptions options = DataPlane::process_options();
  options.threshold_bytes = 1024;
  DataPlane::configure(options);
  auto release = transfer->export_large(values, /*expires=*/false, "job-a");
  REQUIRE(release);
  REQUIRE(transfer->has_handles(values[0]));
  auto stolen = values;
  CHECK_THROWS_WITH(transfer->import_handles(stolen, "job-b"), Catch::Contains("wrong data plane token"));
  CHECK_THROWS_WITH(transfer->import_handles(stolen, ""), Catch::Contains("wrong data plane token"));
  transfer->import_handles(values, "job-a");
  CHECK(torch::equal(values[0].dataproto().batch.at("x"), batch.batch.at("x")));
  release();
  options.threshold_bytes = size_t{1} << 20;
  DataPlane::configure(options);
  DataPlane::set_process_token("");  // the other tests run without a secret
}

TEST_CASE("a stored object is fetched bit for bit exactly once; a second fetch is an unknown id") {
  DataPlane plane;
  const auto bytes = pattern(3 << 20);
  ObjectRef ref = plane.put(bytes);
  CHECK(ref.host == "127.0.0.1");
  CHECK(ref.port == plane.port());
  CHECK(ref.id.size() == 32);
  CHECK(ref.size == bytes.size());
  CHECK(plane.held() == 1);
  const uint64_t before = DataPlane::fetches();
  CHECK(DataPlane::fetch(ref, 2s) == bytes);
  CHECK(DataPlane::fetches() == before + 1);
  CHECK(plane.held() == 0);
  CHECK(plane.stats().fetched == 1);
  CHECK(plane.stats().bytes_served == bytes.size());
  CHECK_THROWS_WITH(DataPlane::fetch(ref, 2s), Catch::Contains("unknown object id") && Catch::Contains(ref.id) &&
                                                   Catch::Contains(ref.address()));
}

TEST_CASE("every put gets a fresh random 128-bit id; an empty object travels too") {
  DataPlane plane;
  auto a = plane.put(std::vector<char>{}), b = plane.put(std::vector<char>{});
  CHECK(a.id != b.id);
  CHECK(DataPlane::fetch(a, 2s).empty());
  CHECK(plane.held() == 1);
}

TEST_CASE("a DataProto put is encoded when fetched; the handle carries the encoding's size") {
  DataPlane plane;
  const DataProto batch = big_batch(int64_t{2} << 20);
  ObjectRef ref = plane.put(batch);
  CHECK(ref.size == dataproto::serialized_size(batch));
  auto bytes = DataPlane::fetch(ref, 2s);
  CHECK(bytes == dataproto::serialize(batch));
  check_same(dataproto::deserialize_owned(std::move(bytes)), batch);
  // The next one is encoded into the buffer the first one was sent from.
  check_same(dataproto::deserialize_owned(DataPlane::fetch(plane.put(batch), 2s)), batch);
  CHECK(plane.held() == 0);
}

TEST_CASE("fetch of an id the holder never stored is a DataPlaneError naming holder and id") {
  DataPlane plane;
  plane.put(pattern(100));
  auto ref = ref_to(plane.port(), 100);
  CHECK_THROWS_AS(DataPlane::fetch(ref, 2s), DataPlaneError);
  CHECK_THROWS_WITH(DataPlane::fetch(ref, 2s), Catch::Contains("unknown object id") &&
                                                   Catch::Contains("00112233445566778899aabbccddeeff") &&
                                                   Catch::Contains("127.0.0.1:" + std::to_string(plane.port())));
  CHECK(plane.held() == 1);  // nothing of the real object was given away
  CHECK(plane.stats().unknown == 2);
}

TEST_CASE("fetch from a port where nothing listens is a DataPlaneError saying the connection was refused") {
  const int port = test::closed_port();
  CHECK_THROWS_WITH(DataPlane::fetch(ref_to(port, 10), 2s),
                    Catch::Contains("127.0.0.1:" + std::to_string(port)) && Catch::Contains("cannot connect") &&
                        Catch::Contains("refused"));
}

TEST_CASE("a handle announcing an impossible size fails with a DataPlaneError, not a crash") {
  DataPlane plane;
  CHECK_THROWS_WITH(DataPlane::fetch(ref_to(plane.port(), uint64_t{1} << 62), 2s), Catch::Contains("cannot allocate"));
}

TEST_CASE("a handle whose id is not 32 hex digits is refused before connecting") {
  ObjectRef ref = ref_to(test::closed_port(), 10);
  ref.id = "not-an-id";
  CHECK_THROWS_WITH(DataPlane::fetch(ref, 2s), Catch::Contains("not 32 hex digits"));
}

TEST_CASE("a holder that closes mid-transfer gives a short-read error with the byte counts") {
  FakeHolder fake;
  fake.serve_once([](int fd) {
    char head[9] = {0};
    const uint64_t n = 1000;
    std::memcpy(head + 1, &n, 8);  // little-endian host
    ::send(fd, head, sizeof head, 0);
    ::send(fd, "0123456789", 10, 0);
  });
  CHECK_THROWS_WITH(DataPlane::fetch(ref_to(fake.port(), 1000), 2s),
                    Catch::Contains("short read") && Catch::Contains("10 of 1000 bytes"));
}

TEST_CASE("a holder that announces another size than the handle is refused") {
  FakeHolder fake;
  fake.serve_once([](int fd) {
    char head[9] = {0};
    const uint64_t n = 5;
    std::memcpy(head + 1, &n, 8);
    ::send(fd, head, sizeof head, 0);
  });
  CHECK_THROWS_WITH(DataPlane::fetch(ref_to(fake.port(), 1000), 2s),
                    Catch::Contains("announces 5 bytes") && Catch::Contains("says 1000"));
}

TEST_CASE("a silent holder makes fetch time out after io_timeout, never hang") {
  FakeHolder fake;
  std::promise<void> release;
  auto released = release.get_future().share();
  fake.serve_once([released](int) { released.wait_for(5s); });
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH(DataPlane::fetch(ref_to(fake.port(), 10), 200ms), Catch::Contains("timed out after 200 ms"));
  CHECK(Clock::now() - t0 < 2s);
  release.set_value();
}

TEST_CASE("release frees an object; discard frees it at its holder; both report whether it was there") {
  DataPlane plane;
  auto a = plane.put(pattern(10)), b = plane.put(pattern(10));
  CHECK(plane.release(a.id));
  CHECK_FALSE(plane.release(a.id));
  CHECK(DataPlane::discard(b, 2s));
  CHECK_FALSE(DataPlane::discard(b, 2s));
  CHECK(plane.held() == 0);
  CHECK(plane.stats().released == 2);
  CHECK_FALSE(DataPlane::discard(ref_to(test::closed_port(), 1), 2s));  // unreachable: false, no throw
}

TEST_CASE("objects put with expiry are dropped after object_ttl, the others stay") {
  DataPlane plane({.object_ttl = 100ms});
  auto expiring = plane.put(pattern(10), /*expires=*/true);
  auto kept = plane.put(pattern(10), /*expires=*/false);
  std::this_thread::sleep_for(300ms);
  CHECK(plane.held() == 1);
  CHECK(plane.stats().expired == 1);
  CHECK_THROWS_WITH(DataPlane::fetch(expiring, 2s), Catch::Contains("unknown object id"));
  CHECK(DataPlane::fetch(kept, 2s).size() == 10);
}

TEST_CASE("a plane that cannot bind its address is a DataPlaneError naming it") {
  CHECK_THROWS_WITH(DataPlane({.bind = "not-an-address"}), Catch::Contains("not-an-address"));
  DataPlane first;
  CHECK_THROWS_WITH(DataPlane({.port = first.port()}),
                    Catch::Contains("127.0.0.1:" + std::to_string(first.port())) && Catch::Contains("cannot bind"));
}

TEST_CASE("export_large swaps only DataProtos at or above the threshold (also in lists) for handles") {
  DataPlane plane({.threshold_bytes = 4096});
  DataProto small(TensorDict{{"x", torch::ones({2, 2})}});
  DataProto large(TensorDict{{"x", torch::randn({64, 64})}});  // 16 KiB
  std::vector<Value> values{Value(small), Value(large), Value(Json(3)),
                            Value(Value::List{Value(large), Value(small)})};
  auto refs = export_large(values, plane);
  REQUIRE(refs.size() == 2);
  CHECK(values[0].is_dataproto());
  CHECK(is_object_ref(values[1]));
  CHECK(values[2].json() == 3);
  CHECK(is_object_ref(values[3].list()[0]));
  CHECK(values[3].list()[1].is_dataproto());
  CHECK(object_refs_in(values[3]).size() == 1);
  CHECK(plane.held() == 2);
  CHECK(refs[0].size == dataproto::serialized_size(large));

  import_refs(values, 2s);
  CHECK(plane.held() == 0);
  check_same(values[1].dataproto(), large);
  check_same(values[3].list()[0].dataproto(), large);
  CHECK(object_refs_in(values[3]).empty());
}

TEST_CASE("a disabled plane leaves every DataProto inline") {
  DataPlane plane({.threshold_bytes = 1, .enabled = false});
  std::vector<Value> values{Value(DataProto(TensorDict{{"x", torch::ones({4, 4})}}))};
  CHECK(export_large(values, plane).empty());
  CHECK(values[0].is_dataproto());
}

TEST_CASE("import_refs that fails on one handle discards the handles it did not reach") {
  DataPlane plane;
  auto good = plane.put(pattern(10));
  std::vector<Value> values{Value(ref_to(test::closed_port(), 10).to_json()), Value(good.to_json())};
  CHECK_THROWS_AS(import_refs(values, 1s), DataPlaneError);
  CHECK(plane.held() == 0);
  CHECK(plane.stats().released == 1);
}

TEST_CASE("a JSON value that is not exactly a handle is not taken for one") {
  CHECK_FALSE(is_object_ref(Value(Json{{"$hyflow_object", Json::object()}, {"other", 1}})));
  CHECK_FALSE(is_object_ref(Value(Json::array())));
  CHECK_THROWS_AS(ObjectRef::from_json(Json{{"$hyflow_object", Json{{"host", "h"}}}}), FormatError);
}

TEST_CASE("data plane options come from the environment; bad values name the variable") {
  {
    ScopedEnv a("HYFLOW_DATA_PLANE_THRESHOLD", "2048");
    ScopedEnv b("HYFLOW_DATA_PLANE", "off");
    ScopedEnv c("HYFLOW_DATA_PLANE_TIMEOUT_MS", "1500");
    auto o = DataPlaneOptions::from_environment();
    CHECK(o.threshold_bytes == 2048);
    CHECK_FALSE(o.enabled);
    CHECK(o.io_timeout == 1500ms);
  }
  ScopedEnv bad("HYFLOW_DATA_PLANE_THRESHOLD", "1M");
  CHECK_THROWS_WITH(DataPlaneOptions::from_environment(), Catch::Contains("HYFLOW_DATA_PLANE_THRESHOLD='1M'"));
}

TEST_CASE("over TLS connections the data plane stays off unless with_tls says otherwise") {
  const DataPlaneOptions saved = DataPlane::process_options();
  DataPlaneOptions o = saved;
  o.enabled = true;
  o.with_tls = false;
  DataPlane::configure(o);
  CHECK(data_plane_in_use(/*caf_uses_tls=*/false));
  CHECK_FALSE(data_plane_in_use(/*caf_uses_tls=*/true));
  o.with_tls = true;
  DataPlane::configure(o);
  CHECK(data_plane_in_use(true));
  o.enabled = false;
  DataPlane::configure(o);
  CHECK_FALSE(data_plane_in_use(false));
  DataPlane::configure(saved);
  {
    ScopedEnv env("HYFLOW_DATA_PLANE_WITH_TLS", "1");
    CHECK(DataPlaneOptions::from_environment().with_tls);
  }
  ScopedEnv bad("HYFLOW_DATA_PLANE_WITH_TLS", "yes");
  CHECK_THROWS_WITH(DataPlaneOptions::from_environment(), Catch::Contains("HYFLOW_DATA_PLANE_WITH_TLS='yes'"));
}

// ---- through a caf-node worker ----------------------------------------------------------------

TEST_CASE("a 64 MiB DataProto goes to a caf-node worker and back over the data plane, bit for bit") {
  test::register_test_workers();
  test::NodeProcess node;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
    const DataProto batch = big_batch(int64_t{64} << 20);
    auto& plane = DataPlane::process();
    const auto put_before = plane.stats().put;
    const auto fetches_before = DataPlane::fetches();
    DataProto back = wg.call(&test::EchoWorker::identity, batch);
    CHECK(plane.stats().put == put_before + 1);         // the argument went by data plane
    CHECK(DataPlane::fetches() == fetches_before + 1);  // and so did the result
    CHECK(plane.held() == 0);                           // fetched by the worker: freed
    check_same(back, batch);
  }
  rt.reset();
}

TEST_CASE("with a shared secret, large DataProtos travel both ways between token-checking data servers") {
  test::register_test_workers();
  const std::string file = "/tmp/hyflow-data-plane-secret-" + std::to_string(getpid());
  std::ofstream(file) << "data plane secret\n";
  test::NodeProcess node({"--secret-file=" + file});
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}, .secret = read_secret_file(file)});
    CHECK(DataPlane::process_token() == data_plane_token("data plane secret"));
    // Both ways travel under this session's job token, which controller and node derive from the
    // job id: a node that used the cluster token instead would be refused (tested above).
    CHECK(cluster->job_id().size() == 32);
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
    const DataProto batch = big_batch(int64_t{4} << 20);
    const auto fetches_before = DataPlane::fetches();
    const auto refused_before = DataPlane::process().stats().refused;
    DataProto back = wg.call(&test::EchoWorker::identity, batch);
    CHECK(DataPlane::fetches() == fetches_before + 1);  // the result came over the node's data server
    CHECK(DataPlane::process().stats().refused == refused_before);
    check_same(back, batch);
  }
  rt.reset();
  DataPlane::set_process_token("");  // the other tests run without a secret
  std::remove(file.c_str());
}

TEST_CASE("DP_COMPUTE_PROTO over 2 remote ranks: every chunk goes by data plane, the concat is bit for bit") {
  test::register_test_workers();
  test::NodeProcess node;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});
    const DataProto batch = big_batch(int64_t{8} << 20);  // two 4 MiB chunks
    auto& plane = DataPlane::process();
    const auto put_before = plane.stats().put;
    const auto fetches_before = DataPlane::fetches();
    DataProto back = wg.call(&test::EchoWorker::identity, batch);
    CHECK(plane.stats().put == put_before + 2);
    CHECK(DataPlane::fetches() == fetches_before + 2);  // pulled in parallel, one thread per rank
    CHECK(plane.held() == 0);
    check_same(back, batch);
  }
  rt.reset();
}

TEST_CASE("small DataProtos stay inline in the CAF messages") {
  test::register_test_workers();
  test::NodeProcess node;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
    const auto put_before = DataPlane::process().stats().put;
    const auto fetches_before = DataPlane::fetches();
    DataProto small = test::make_batch(8);
    DataProto back = wg.call(&test::EchoWorker::double_x, small);
    CHECK(torch::equal(back.batch.at("x"), small.batch.at("x") * 2));
    CHECK(DataPlane::process().stats().put == put_before);
    CHECK(DataPlane::fetches() == fetches_before);
  }
  rt.reset();
}

TEST_CASE("an argument object is freed when its call times out before the worker fetched it") {
  test::register_test_workers();
  test::NodeProcess node;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
    auto& plane = DataPlane::process();
    // Keep the worker busy so that it cannot fetch the next call's argument in time.
    auto busy = std::async(std::launch::async, [&] { return wg.call("sleep_on_rank", 0, 1500); });
    std::this_thread::sleep_for(200ms);
    const auto put_before = plane.stats().put;
    CHECK_THROWS_AS(wg.call(CallOptions{.deadline = 300ms}, "identity", big_batch(int64_t{8} << 20)), CallTimeoutError);
    CHECK(plane.stats().put == put_before + 1);
    CHECK(plane.held() == 0);  // freed when the call failed, not left for the worker
    busy.get();
    // The worker then finds the object gone (its late answer is dropped); the group still works.
    DataProto back = wg.call(&test::EchoWorker::identity, big_batch(int64_t{2} << 20));
    check_same(back, big_batch(int64_t{2} << 20));
    CHECK(plane.held() == 0);
  }
  rt.reset();
}

TEST_CASE("a result the controller cannot fetch fails the call with an error naming the rank and node") {
  test::register_test_workers();
  DataPlane::process();  // this process's plane keeps its own (good) address
  // The node advertises an address where its data server does not listen.
  ScopedEnv env("HYFLOW_DATA_PLANE_HOST", "127.0.0.2");
  test::NodeProcess node;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
    const auto t0 = Clock::now();
    try {
      wg.call(&test::EchoWorker::identity, big_batch(int64_t{4} << 20));
      FAIL("the call should have failed");
    } catch (const CallError& e) {
      CHECK(e.rank() == 0);
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("method 'identity'") && Catch::Contains("rank 0 of 1") &&
                           Catch::Contains("@" + node.address()) && Catch::Contains("127.0.0.2") &&
                           Catch::Contains("could not be received"));
    }
    CHECK(Clock::now() - t0 < 15s);
    // Small results still arrive inline.
    std::vector<std::string> who = wg.call(&test::EchoWorker::whoami);
    CHECK(who == std::vector<std::string>{"rank 0/1"});
  }
  rt.reset();
}
