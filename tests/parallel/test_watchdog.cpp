// The collective watchdog and the rendezvous helpers, with fake collectives whose completion
// the test controls (the NCCL communicator hands the watchdog CUDA event queries instead).

#include <hyflow/core/error.hpp>
#include <hyflow/parallel/peer_liveness.hpp>
#include <hyflow/parallel/watchdog.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <mutex>
#include <thread>

using namespace hyflow::parallel;
using namespace std::chrono_literals;

namespace {
CollectiveWatchdog::Options options(int rank, int world, std::chrono::milliseconds timeout) {
  return {.group = "actor", .rank = rank, .world_size = world, .timeout = timeout, .poll_interval = 1ms};
}
}  // namespace

TEST_CASE("collectives that finish leave nothing pending and never abort") {
  MemoryStore store;
  std::atomic<int> aborts{0};
  CollectiveWatchdog dog(options(0, 1, 5s), &store, [&] { ++aborts; });
  std::atomic<bool> first{false}, second{false};
  CHECK(dog.begin("all_reduce", [&] { return first.load(); }) == 1);
  CHECK(dog.begin("broadcast", [&] { return second.load(); }) == 2);
  CHECK(dog.pending() == 2);
  std::thread finisher([&] {
    std::this_thread::sleep_for(20ms);
    first = true;
    second = true;
  });
  dog.wait_all();
  finisher.join();
  CHECK(dog.pending() == 0);
  CHECK(aborts == 0);
  CHECK_NOTHROW(dog.check());
}

TEST_CASE("a stuck collective aborts once and names the op, the group and the ranks that never arrived") {
  MemoryStore store;
  std::atomic<int> aborts{0};
  // ranks 1 and 2 entered collective #1 only; rank 3 never entered any
  store.set("actor/progress/1", std::vector<uint8_t>{1, 0, 0, 0, 0, 0, 0, 0});
  store.set("actor/progress/2", std::vector<uint8_t>{2, 0, 0, 0, 0, 0, 0, 0});
  CollectiveWatchdog dog(options(0, 4, 100ms), &store, [&] { ++aborts; });
  dog.begin("all_gather", [] { return true; });
  dog.begin("reduce_scatter", [] { return false; });
  CHECK_THROWS_WITH(dog.wait_all(), Catch::Contains("reduce_scatter #2") && Catch::Contains("group 'actor'") &&
                                        Catch::Contains("Ranks that did not arrive: 1, 3") &&
                                        Catch::Contains("aborted"));
  CHECK(aborts == 1);
  CHECK(dog.failed());
  CHECK_THROWS_WITH(dog.check(), Catch::Contains("reduce_scatter #2"));
  CHECK_THROWS_WITH(dog.begin("all_reduce", [] { return true; }), Catch::Contains("reduce_scatter #2"));
  std::this_thread::sleep_for(20ms);
  CHECK(aborts == 1);
}

TEST_CASE("when every rank entered the stuck collective the message says the collective itself hung") {
  MemoryStore store;
  std::atomic<bool> release{false};
  std::vector<std::unique_ptr<CollectiveWatchdog>> dogs;
  for (int r = 0; r < 2; ++r) dogs.push_back(std::make_unique<CollectiveWatchdog>(options(r, 2, 150ms), &store, [] {}));
  for (auto& d : dogs) d->begin("all_reduce", [&] { return release.load(); });
  for (auto& d : dogs) CHECK_THROWS_WITH(d->wait_all(), Catch::Contains("Every rank entered it"));
}

TEST_CASE("ranks publish how far they got through the store") {
  MemoryStore store;
  CollectiveWatchdog dog(options(3, 4, 5s), &store, [] {});
  dog.begin("barrier", [] { return true; });
  dog.begin("barrier", [] { return true; });
  dog.wait_all();
  auto seen = store.get("actor/progress/3", 2s);
  CHECK(seen == std::vector<uint8_t>{2, 0, 0, 0, 0, 0, 0, 0});
}

TEST_CASE("the unique id goes from rank 0 to every rank; a late rank 0 times out naming the key") {
  MemoryStore store;
  std::vector<std::vector<uint8_t>> got(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      got[static_cast<size_t>(r)] = exchange_unique_id(
          store, r, "g/uid",
          [] {
            return std::vector<uint8_t>{1, 2, 3};
          },
          5s);
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& g : got) CHECK(g == std::vector<uint8_t>{1, 2, 3});
  MemoryStore empty;
  CHECK_THROWS_WITH(exchange_unique_id(
                        empty, 2, "g/uid", [] { return std::vector<uint8_t>{}; }, 50ms),
                    Catch::Contains("rank 2") && Catch::Contains("g/uid"));
}

TEST_CASE("a store barrier names the ranks that never arrived") {
  MemoryStore store;
  store.set("join/1", {1});
  CHECK_THROWS_WITH(store_barrier(store, "join", 0, 4, 50ms),
                    Catch::Contains("ranks that never arrived: 2, 3") && Catch::Contains("rank 0 of 4"));
  store.set("join/2", {1});
  store.set("join/3", {1});
  CHECK_NOTHROW(store_barrier(store, "join", 0, 4, 50ms));
}

TEST_CASE("a watchdog needs a positive timeout") {
  CHECK_THROWS_AS(CollectiveWatchdog(options(0, 1, 0ms), nullptr, [] {}), hyflow::ValueError);
}

// --- PeerLiveness ----------------------------------------------------------------------------

namespace {
/// A view of a shared store that can be cut off, as if the store's process were gone.
class CuttableStore : public KeyValueStore {
 public:
  CuttableStore(MemoryStore& store, std::atomic<bool>& cut) : store_(store), cut_(cut) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    if (cut_) throw hyflow::Error("connection reset by peer");
    store_.set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    if (cut_) throw hyflow::Error("connection reset by peer");
    return store_.get(key, timeout);
  }
  std::optional<std::vector<uint8_t>> try_get(const std::string& key) override {
    if (cut_) throw hyflow::Error("connection reset by peer");
    return store_.try_get(key);
  }

 private:
  MemoryStore& store_;
  std::atomic<bool>& cut_;
};

PeerLiveness::Options liveness_options(int rank, int world, std::chrono::milliseconds timeout = 200ms) {
  return {.group = "actor", .rank = rank, .world_size = world, .interval = 5ms, .timeout = timeout,
          .store_address = "127.0.0.1:29500"};
}

/// Waits (bounded) until `liveness` reports a failure.
std::optional<std::string> failure_within(const PeerLiveness& liveness, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto f = liveness.failure()) return f;
    std::this_thread::sleep_for(2ms);
  }
  return liveness.failure();
}
}  // namespace

TEST_CASE("ranks that keep signalling never accuse each other") {
  MemoryStore store;
  std::atomic<bool> cut{false};
  std::vector<std::unique_ptr<PeerLiveness>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(
        std::make_unique<PeerLiveness>(liveness_options(r, 3, 500ms), std::make_unique<CuttableStore>(store, cut)));
  std::this_thread::sleep_for(1500ms);  // three times the timeout
  for (auto& rank : ranks) CHECK_FALSE(rank->failure().has_value());
}

TEST_CASE("a rank that stops signalling is named by the others, once, through on_failure") {
  MemoryStore store;
  std::atomic<bool> cut{false};
  std::atomic<int> calls{0};
  std::string reported;
  std::mutex reported_mutex;
  auto on_failure = [&](const std::string& why) {
    std::lock_guard lock(reported_mutex);
    reported = why;
    ++calls;
  };
  PeerLiveness rank0(liveness_options(0, 3), std::make_unique<CuttableStore>(store, cut), on_failure);
  PeerLiveness rank1(liveness_options(1, 3), std::make_unique<CuttableStore>(store, cut));
  PeerLiveness rank2(liveness_options(2, 3), std::make_unique<CuttableStore>(store, cut));
  std::this_thread::sleep_for(50ms);
  rank2.stop();
  auto seen0 = failure_within(rank0, 10s);
  auto seen1 = failure_within(rank1, 10s);
  REQUIRE(seen0.has_value());
  REQUIRE(seen1.has_value());
  CHECK_THAT(*seen0, Catch::Contains("rank 2 of group 'actor'") && Catch::Contains("has not signalled for 200 ms"));
  CHECK_THAT(*seen1, Catch::Contains("rank 2 of group 'actor'"));
  std::this_thread::sleep_for(50ms);
  std::lock_guard lock(reported_mutex);
  CHECK(calls == 1);
  CHECK(reported == *seen0);
}

TEST_CASE("a rank that never signals is named as such") {
  MemoryStore store;
  std::atomic<bool> cut{false};
  PeerLiveness rank0(liveness_options(0, 2), std::make_unique<CuttableStore>(store, cut));
  auto seen = failure_within(rank0, 10s);
  REQUIRE(seen.has_value());
  CHECK_THAT(*seen, Catch::Contains("rank 1 of group 'actor'") && Catch::Contains("(it never did)"));
}

TEST_CASE("a store that cannot be reached for the timeout is named with its address") {
  MemoryStore store;
  std::atomic<bool> cut{false};
  PeerLiveness rank1(liveness_options(1, 2), std::make_unique<CuttableStore>(store, cut));
  PeerLiveness rank0(liveness_options(0, 2), std::make_unique<CuttableStore>(store, cut));
  std::this_thread::sleep_for(50ms);
  cut = true;
  auto seen = failure_within(rank1, 10s);
  REQUIRE(seen.has_value());
  CHECK_THAT(*seen, Catch::Contains("store of group 'actor' at 127.0.0.1:29500") &&
                        Catch::Contains("connection reset by peer"));
}

TEST_CASE("peer liveness rejects a bad interval, rank or store") {
  MemoryStore store;
  std::atomic<bool> cut{false};
  auto o = liveness_options(0, 2);
  o.timeout = 1ms;
  CHECK_THROWS_AS(PeerLiveness(o, std::make_unique<CuttableStore>(store, cut)), hyflow::ValueError);
  o = liveness_options(2, 2);
  CHECK_THROWS_WITH(PeerLiveness(o, std::make_unique<CuttableStore>(store, cut)),
                    Catch::Contains("rank 2 is outside world size 2"));
  CHECK_THROWS_AS(PeerLiveness(liveness_options(0, 2), nullptr), hyflow::ValueError);
}
