// The collective watchdog and the rendezvous helpers, with fake collectives whose completion
// the test controls (the NCCL communicator hands the watchdog CUDA event queries instead).

#include <hyflow/core/error.hpp>
#include <hyflow/parallel/peer_liveness.hpp>
#include <hyflow/parallel/watchdog.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
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

// --- launch against abort, device errors, start-relative timeouts ----------------------------

namespace {
/// An event whose state the test decides; `on_destroy` runs in its destructor.
class FakeEvent : public CollectiveEvent {
 public:
  FakeEvent(std::function<State()> query, std::function<void()> on_destroy = {})
      : query_(std::move(query)), on_destroy_(std::move(on_destroy)) {}
  ~FakeEvent() override {
    if (on_destroy_) on_destroy_();
  }
  State query() override { return query_(); }

 private:
  std::function<State()> query_;
  std::function<void()> on_destroy_;
};

/// A store whose reads hang for `hang` (as over a network that is the problem), writes pass.
class HangingStore : public KeyValueStore {
 public:
  explicit HangingStore(std::chrono::milliseconds hang) : hang_(hang) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_.set(key, value); }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::this_thread::sleep_for(hang_);
    return store_.get(key, timeout);
  }
  std::optional<std::vector<uint8_t>> try_get(const std::string& key) override {
    std::this_thread::sleep_for(hang_);
    return store_.try_get(key);
  }

 private:
  std::chrono::milliseconds hang_;
  MemoryStore store_;
};

using Clock = std::chrono::steady_clock;
}  // namespace

TEST_CASE("the failure is recorded before the abort, and a hanging store does not delay the abort") {
  HangingStore store(1500ms);
  std::atomic<int> aborts{0};
  std::atomic<bool> recorded_first{false};
  std::atomic<int64_t> abort_ms{-1};
  const auto t0 = Clock::now();
  CollectiveWatchdog* self = nullptr;
  CollectiveWatchdog dog(options(0, 2, 50ms), &store, [&] {
    ++aborts;
    abort_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    try {
      self->check();  // a caller passing check() now would enqueue on an aborted communicator
    } catch (const hyflow::Error&) {
      recorded_first = true;
    }
  });
  self = &dog;
  dog.begin("all_reduce", [] { return false; });
  CHECK_THROWS_WITH(dog.wait_all(), Catch::Contains("all_reduce #1") && Catch::Contains("aborted"));
  CHECK(aborts == 1);
  CHECK(recorded_first);
  // the abort came at the timeout, not after the 1.5 s store read
  CHECK(abort_ms >= 50);
  CHECK(abort_ms < 1000);
}

TEST_CASE("the description is bounded by describe_timeout and says which ranks it could not read") {
  HangingStore store(300ms);
  auto o = options(0, 4, 30ms);
  o.describe_timeout = 100ms;
  o.launch_grace = 50ms;
  CollectiveWatchdog dog(o, &store, [] {});
  dog.begin("broadcast", [] { return false; });
  const auto t0 = Clock::now();
  // rank 1 read (300 ms, past the bound), ranks 2 and 3 not read
  CHECK_THROWS_WITH(dog.wait_all(), Catch::Contains("broadcast #1") && Catch::Contains("aborted"));
  CHECK(Clock::now() - t0 < 1s);
  std::this_thread::sleep_for(400ms);
  CHECK_THROWS_WITH(dog.check(), Catch::Contains("did not answer within 100 ms for ranks 2, 3"));
}

TEST_CASE("abort never overlaps a launch: a slow launch finishes enqueuing first, later ones never start") {
  MemoryStore store;
  std::atomic<bool> in_launch{false}, overlapped{false}, aborted{false};
  std::atomic<int> aborts{0}, enqueued_after_abort{0}, launched{0};
  CollectiveWatchdog dog(options(0, 1, 200ms), &store, [&] {
    if (in_launch) overlapped = true;
    ++aborts;
    aborted = true;
  });
  dog.begin("all_gather", [] { return false; });  // stuck: times out 200 ms after its first poll
  auto slow_launch = [&](std::chrono::milliseconds delay) {
    return [&, delay]() -> std::unique_ptr<CollectiveEvent> {
      in_launch = true;
      if (aborted) ++enqueued_after_abort;
      std::this_thread::sleep_for(delay);  // a slow enqueue (NCCL connecting to its peers)
      if (aborted) ++enqueued_after_abort;
      ++launched;
      in_launch = false;
      return std::make_unique<FakeEvent>([] { return CollectiveEvent::State::done; });
    };
  };
  std::atomic<bool> slow_threw{false};
  std::thread slow([&] {
    std::this_thread::sleep_for(100ms);  // in the middle of its 250 ms enqueue at the timeout
    try {
      dog.launch("broadcast", slow_launch(250ms));
    } catch (const hyflow::Error&) {
      slow_threw = true;  // the failure came while it was enqueued: the collective is aborted too
    }
  });
  // another caller keeps launching short collectives until the watchdog refuses it
  std::atomic<int> refused{0};
  std::thread eager([&] {
    const auto deadline = Clock::now() + 5s;
    while (Clock::now() < deadline) {
      try {
        dog.launch("all_reduce", slow_launch(1ms));
      } catch (const hyflow::Error&) {
        ++refused;
        break;
      }
    }
  });
  slow.join();
  eager.join();
  CHECK_THROWS(dog.wait_all());  // returns once the abort is done and the failure described
  CHECK(aborts == 1);
  CHECK_FALSE(overlapped);
  CHECK(enqueued_after_abort == 0);
  CHECK(slow_threw);
  CHECK(refused == 1);
  const int before = launched;
  bool called = false;
  CHECK_THROWS_WITH(dog.launch("all_reduce",
                               [&]() -> std::unique_ptr<CollectiveEvent> {
                                 called = true;
                                 return nullptr;
                               }),
                    Catch::Contains("all_gather #1"));
  CHECK_FALSE(called);
  CHECK(launched == before);
}

TEST_CASE("a launch hung in the host is aborted after the timeout, which frees it") {
  MemoryStore store;
  std::mutex mutex;
  std::condition_variable cv;
  bool aborted = false;
  CollectiveWatchdog dog(options(0, 1, 50ms), &store, [&] {
    std::lock_guard lock(mutex);
    aborted = true;
    cv.notify_all();
  });
  CHECK_THROWS_WITH(dog.launch("all_reduce",
                               [&]() -> std::unique_ptr<CollectiveEvent> {
                                 std::unique_lock lock(mutex);
                                 cv.wait_for(lock, 5s, [&] { return aborted; });  // ncclCommAbort frees it
                                 return std::make_unique<FakeEvent>([] { return CollectiveEvent::State::done; });
                               }),
                    Catch::Contains("all_reduce #1") && Catch::Contains("hung in the host"));
  CHECK(aborted);
}

TEST_CASE("an event error is a failure of the collective, not its end") {
  MemoryStore store;
  std::atomic<int> aborts{0};
  CollectiveWatchdog dog(options(0, 1, 5s), &store, [&] { ++aborts; });
  dog.launch("reduce_scatter", [] {
    return std::make_unique<FakeEvent>([]() -> CollectiveEvent::State {
      throw hyflow::Error("cudaEventQuery: cudaErrorIllegalAddress: an illegal memory access was encountered");
    });
  });
  CHECK_THROWS_WITH(dog.wait_all(), Catch::Contains("reduce_scatter #1") && Catch::Contains("failed on the device") &&
                                        Catch::Contains("cudaErrorIllegalAddress"));
  CHECK(aborts == 1);
}

TEST_CASE("the timeout runs from when the collective starts, not from when it was enqueued") {
  MemoryStore store;
  std::atomic<int> aborts{0};
  CollectiveWatchdog dog(options(0, 1, 100ms), &store, [&] { ++aborts; });
  // queued behind other work for 300 ms (3 timeouts), then runs 50 ms
  const auto t0 = Clock::now();
  dog.launch("all_reduce", [t0] {
    return std::make_unique<FakeEvent>([t0] {
      const auto age = Clock::now() - t0;
      if (age < 300ms) return CollectiveEvent::State::queued;
      return age < 350ms ? CollectiveEvent::State::running : CollectiveEvent::State::done;
    });
  });
  CHECK_NOTHROW(dog.wait_all());
  CHECK(aborts == 0);
  // one that starts and never ends times out a timeout after its start
  std::atomic<int64_t> started_ms{-1};
  const auto t1 = Clock::now();
  dog.launch("broadcast", [&] {
    return std::make_unique<FakeEvent>([&, t1] {
      if (Clock::now() - t1 < 200ms) return CollectiveEvent::State::queued;
      if (started_ms < 0) started_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t1).count();
      return CollectiveEvent::State::running;
    });
  });
  CHECK_THROWS_WITH(dog.wait_all(), Catch::Contains("broadcast #2") && Catch::Contains("within 100 ms of starting"));
  const auto failed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t1).count();
  CHECK(started_ms >= 200);
  CHECK(failed_ms >= started_ms + 100);
  CHECK(aborts == 1);
}

TEST_CASE("events are queried and destroyed only on the watchdog thread, after on_thread_start") {
  static thread_local bool device_set = false;
  MemoryStore store;
  std::atomic<int> queries{0}, destroyed{0}, off_device{0};
  {
    auto o = options(0, 1, 5s);
    o.on_thread_start = [] { device_set = true; };
    CollectiveWatchdog dog(o, &store, [] {});
    std::atomic<bool> release{false};
    for (int i = 0; i < 3; ++i) {
      dog.launch("all_reduce", [&, i] {
        return std::make_unique<FakeEvent>(
            [&, i] {
              ++queries;
              if (!device_set) ++off_device;
              return i == 0 || release ? CollectiveEvent::State::done : CollectiveEvent::State::running;
            },
            [&] {
              ++destroyed;
              if (!device_set) ++off_device;
            });
      });
    }
    const auto deadline = Clock::now() + 2s;
    while (dog.pending() > 2 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    CHECK(dog.pending() == 2);
  }  // two events still pending: destroyed by the watchdog thread on its way out
  CHECK(queries > 0);
  CHECK(destroyed == 3);
  CHECK(off_device == 0);
  CHECK_FALSE(device_set);  // the test's thread never set it
}

TEST_CASE("the collective timeout defaults to verl's 600 s") {
  CHECK(CollectiveWatchdog::Options{}.timeout == 600s);
  CHECK_THROWS_AS(CollectiveWatchdog(CollectiveWatchdog::Options{.poll_interval = 0ms}, nullptr, [] {}),
                  hyflow::ValueError);
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
