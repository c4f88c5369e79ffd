// WorkerGroup end to end: in-process workers (detached CAF actors), every dispatch mode,
// futures, colocation, failures, liveness, the watchdog and collectives.
#include "test_workers.hpp"

#define CATCH_CONFIG_EXTERNAL_INTERFACES  // test event listeners
#include <catch2/catch.hpp>

#include <fstream>

using namespace hyflow;
using namespace hyflow::actors;
using test::EchoWorker;
using test::make_batch;
using namespace std::chrono_literals;

namespace {
// One runtime for the test run. It is stopped when the run ends, before static destruction:
// CAF's actor system must not be torn down from exit handlers.
std::unique_ptr<Runtime> shared_runtime;

Runtime& runtime() {
  if (!shared_runtime) {
    test::register_test_workers();
    shared_runtime = std::make_unique<Runtime>();
  }
  return *shared_runtime;
}

struct StopRuntime : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(const Catch::TestRunStats&) override { shared_runtime.reset(); }
};

WorkerGroup echo_group(int ws, Json args = Json::object(), WorkerGroupOptions options = {}) {
  return WorkerGroup(runtime(), ResourcePool({ws}), WorkerSpec{"EchoWorker", std::move(args)}, std::move(options));
}

DataProto padded_batch(int64_t rows) {
  auto b = make_batch(rows);
  b.meta_info[kAutoPaddingKey] = true;
  return b;
}

long rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}
}  // namespace

CATCH_REGISTER_LISTENER(StopRuntime)

TEST_CASE("every worker learns rank, world size, local rank, master address and port") {
  auto wg = echo_group(3);
  CHECK(wg.world_size() == 3);
  std::vector<Json> envs = wg.call(&Worker::worker_env);
  REQUIRE(envs.size() == 3);
  for (int r = 0; r < 3; ++r) {
    CHECK(envs[r]["RANK"] == r);
    CHECK(envs[r]["WORLD_SIZE"] == 3);
    CHECK(envs[r]["LOCAL_RANK"] == r);
    CHECK(envs[r]["MASTER_ADDR"] == "127.0.0.1");
    CHECK(envs[r]["MASTER_PORT"] == wg.master_port());
    CHECK(envs[r]["DEVICE"] == "cpu");
  }
  CHECK(wg.worker_names()[2] == "EchoWorker_0:2");
}

TEST_CASE("DP_COMPUTE_PROTO through a group: world sizes 1-4, batches not divisible, result un-padded") {
  for (int ws = 1; ws <= 4; ++ws) {
    auto wg = echo_group(ws);
    for (int64_t rows : {1, 5, 7}) {
      CAPTURE(ws, rows);
      auto batch = padded_batch(rows);
      DataProto out = wg.call(&EchoWorker::double_x, batch);
      REQUIRE(out.size() == rows);
      CHECK(torch::equal(out.batch.at("x"), batch.batch.at("x") * 2));
      // rows go to ranks in order: rank of row i is i / chunk
      const int64_t chunk = (rows + dispatch_fns::padding_for(rows, ws)) / ws;
      for (int64_t i = 0; i < rows; ++i) CHECK(out.batch.at("rank")[i].item<int64_t>() == i / chunk);
    }
  }
}

TEST_CASE("ONE_TO_ALL, ALL_TO_ALL, DP_COMPUTE and RANK_ZERO dispatch through a group") {
  for (int ws = 1; ws <= 4; ++ws) {
    CAPTURE(ws);
    auto wg = echo_group(ws, {{"offset", 10}});
    auto one = from_value<std::vector<int>>(wg.call("add_rank", 1), "one");
    REQUIRE(one.size() == static_cast<size_t>(ws));
    for (int r = 0; r < ws; ++r) CHECK(one[r] == 11 + r);
    std::vector<int> inputs(static_cast<size_t>(ws));
    for (int r = 0; r < ws; ++r) inputs[r] = 100 * r;
    std::vector<int> dp = from_value<std::vector<int>>(wg.call("add_rank_dp", per_rank(inputs)), "dp");
    for (int r = 0; r < ws; ++r) CHECK(dp[r] == 100 * r + r + 10);
    std::vector<int> all = from_value<std::vector<int>>(wg.call("add_rank_all", per_rank(inputs)), "all");
    CHECK(all == dp);
    CHECK(from_value<int>(wg.call("add_rank_zero", 5), "zero") == 15);
    std::vector<Json> metrics = from_value<std::vector<Json>>(wg.call("metrics", padded_batch(5)), "metrics");
    REQUIRE(metrics.size() == static_cast<size_t>(ws));
    CHECK(metrics.back()["rank"] == ws - 1);
  }
}

TEST_CASE("DP_COMPUTE with a list of the wrong length fails before anything runs") {
  auto wg = echo_group(3);
  CHECK_THROWS_WITH(wg.call("add_rank_dp", per_rank(std::vector<int>{1, 2})), Catch::Contains("list of 3"));
}

TEST_CASE("execute RANK_ZERO runs only rank 0 and returns its single result") {
  auto wg = echo_group(3);
  wg.call("set_state", 0);
  int r = wg.call(&EchoWorker::only_rank_zero, 4);
  CHECK(r == 400);
}

TEST_CASE("a user-registered dispatch mode and execute mode work through a group") {
  static bool once = [] {
    register_dispatch_mode(
        "TEST_GROUP_SQUARE",
        [](DispatchContext& ctx, std::vector<Value> args) {
          Dispatched d;
          const int x = args.at(0).json().get<int>();
          for (int r = 0; r < ctx.world_size(); ++r) d.per_rank.push_back({Value(Json(x * x))});
          return d;
        },
        [](DispatchContext&, std::vector<Value> outs) {
          int sum = 0;
          for (auto& o : outs) sum += o.json().get<int>();
          return Value(Json(sum));
        });
    register_execute_mode("TEST_GROUP_ODD", {[](int ws) {
                                               std::vector<int> r;
                                               for (int i = 1; i < ws; i += 2) r.push_back(i);
                                               return r;
                                             },
                                             false});
    return true;
  }();
  (void)once;
  // A custom mode is named in define_methods like a predefined one.
  // square_sum: every rank gets 3*3 and adds its rank; the collect sums: 4*9 + 0+1+2+3 = 42.
  struct SquareWorker : EchoWorker {
    using EchoWorker::EchoWorker;
    static void define_methods(MethodTable<SquareWorker>& t) {
      t.add("square_sum", &EchoWorker::add_rank, {.dispatch = "TEST_GROUP_SQUARE"});
      t.add("odd_ranks", &EchoWorker::add_rank, {.dispatch = Dispatch::ONE_TO_ALL, .execute = "TEST_GROUP_ODD"});
    }
  };
  register_worker_type<SquareWorker>("SquareWorker");
  WorkerGroup sq(runtime(), ResourcePool({4}), WorkerSpec{"SquareWorker", Json::object()});
  CHECK(from_value<int>(sq.call("square_sum", 3), "sum") == 42);
  CHECK(from_value<std::vector<int>>(sq.call("odd_ranks", 0), "odd") == std::vector<int>{1, 3});
}

TEST_CASE("nd-compute dispatch sends dp chunks by mesh rank and keeps outputs of collect ranks") {
  auto wg = echo_group(4);
  wg.call("register_mesh", "train", 2);  // dp ranks 0,0,1,1; collect on ranks 0 and 2
  auto batch = make_batch(8);
  DataProto nd = wg.call(&EchoWorker::nd_double_x, batch);
  REQUIRE(nd.size() == 8);
  CHECK(torch::equal(nd.batch.at("x"), batch.batch.at("x") * 2));
  CHECK(nd.batch.at("rank")[3].item<int64_t>() == 0);
  CHECK(nd.batch.at("rank")[4].item<int64_t>() == 2);
  DataProto again = wg.call(&EchoWorker::nd_double_x, batch);  // infos come from the cache
  CHECK(again.size() == 8);
  CHECK_THROWS_AS(wg.call(&EchoWorker::nd_double_x, make_batch(5)), ShapeError);  // no auto-padding
}

TEST_CASE("a non-blocking nd-compute call collects on the flagged ranks without calling back into the group") {
  auto wg = echo_group(4);
  wg.call("register_mesh", "train", 2);
  DataProtoFuture f = wg.call(&EchoWorker::nd_double_x_async, make_batch(8));
  REQUIRE(f.wait_for(std::chrono::milliseconds(5000)));
  CHECK(torch::equal(f.get().batch.at("x"), make_batch(8).batch.at("x") * 2));
}

TEST_CASE("with materialize_futures off a method receives the DataProtoFuture itself") {
  auto wg = echo_group(2);
  DataProtoFuture pending = wg.call(&EchoWorker::plus_one, padded_batch(3));
  std::vector<int64_t> rows = wg.call(&EchoWorker::future_rows, pending);
  CHECK(rows == std::vector<int64_t>{3, 3});
}

TEST_CASE("a member registered under two names must be called by name") {
  auto wg = echo_group(1);
  CHECK_THROWS_WITH(wg.call(&EchoWorker::add_rank, 1),
                    Catch::Contains("several names") && Catch::Contains("'add_rank_dp'"));
}

TEST_CASE("DIRECT_ROLLOUT_METHOD cannot be called through a group") {
  auto wg = echo_group(2);
  CHECK_THROWS_AS(wg.call("generate", make_batch(2)), NotSupportedError);
}

TEST_CASE("DP_COMPUTE_PROTO_WITH_FUNC runs a registered worker function on each chunk") {
  static bool once = (register_worker_function("test_negate", [](Worker& w, DataProto d) {
                        return DataProto(TensorDict{{"x", -d.batch.at("x") + w.rank() * 0}});
                      }),
                      true);
  (void)once;
  auto wg = echo_group(2);
  DataProto out = wg.call(&Worker::execute_with_func_generator, std::string("test_negate"), make_batch(4));
  CHECK(torch::equal(out.batch.at("x"), -make_batch(4).batch.at("x")));
}

TEST_CASE("typed and by-name calls check arguments: by-name mismatches name the method") {
  auto wg = echo_group(2);
  CHECK_THROWS_WITH(wg.call("add_rank", 1, 2), Catch::Contains("'add_rank'") && Catch::Contains("takes 1"));
  CHECK_THROWS_WITH(wg.call("add_rank", std::string("x")),
                    Catch::Contains("add_rank") && Catch::Contains("argument 0") && Catch::Contains("rank 0"));
  CHECK_THROWS_WITH(wg.call("no_such_method"), Catch::Contains("no method 'no_such_method'"));
  std::vector<std::string> who = wg.call(&EchoWorker::whoami);
  CHECK(who[1] == "rank 1/2");
  // A typed result converted to the wrong shape is a BindError naming the method.
  CHECK_THROWS_WITH(([&] { std::string x = wg.call(&EchoWorker::whoami); return x; })(), Catch::Contains("whoami"));
}

TEST_CASE("DataProto crosses the worker boundary without copying tensor storage") {
  auto wg = echo_group(2);
  auto batch = make_batch(4);
  std::vector<int64_t> addresses = wg.call(&EchoWorker::data_address, batch);
  const auto base = reinterpret_cast<intptr_t>(batch.batch.at("x").data_ptr());
  CHECK(addresses[0] == base);
  CHECK(addresses[1] == base + 2 * 3 * static_cast<intptr_t>(sizeof(float)));
  DataProto back = wg.call(&EchoWorker::identity, batch);
  CHECK(back.batch.at("x").data_ptr() != nullptr);
}

TEST_CASE("non-blocking calls return futures that chain into the next call") {
  for (int ws : {1, 3}) {
    auto wg = echo_group(ws);
    auto batch = padded_batch(5);
    DataProtoFuture first = wg.call(&EchoWorker::plus_one, batch);      // non-blocking
    DataProtoFuture second = wg.call(&EchoWorker::plus_one, first);     // chained, still a future
    DataProto out = wg.call(&EchoWorker::double_x, second);            // blocking, materializes
    REQUIRE(out.size() == 5);
    CHECK(torch::equal(out.batch.at("x"), (batch.batch.at("x") + 2) * 2));
    CHECK(second.get().size() == 5);  // futures are un-padded too
  }
}

TEST_CASE("a non-blocking call's future rethrows a worker failure") {
  auto wg = echo_group(2);
  ValueFuture f = wg.call(&EchoWorker::throw_async, 1);
  CHECK_THROWS_WITH(f.get(), Catch::Contains("throw_async") && Catch::Contains("rank 1"));
  ValueFuture ok = wg.call(&EchoWorker::throw_async, -1);
  CHECK(from_value<std::vector<int>>(ok.get(), "ok") == std::vector<int>{0, 1});
}

TEST_CASE("colocated workers: spawn two and three roles sharing the same workers") {
  auto spec = colocated_spec({{"actor", {"CounterRole", {{"step", 1}}}},
                              {"critic", {"CounterRole", {{"step", 10}}}},
                              {"ref", {"ScaleRole", {{"factor", 3.0}}}}});
  WorkerGroup bundle(runtime(), ResourcePool({2}), spec);
  CHECK(bundle.methods().find("actor_bump") != nullptr);
  CHECK(bundle.methods().find("ref_scale") != nullptr);
  SECTION("two roles") {
    auto views = bundle.spawn({"actor", "critic"});
    REQUIRE(views.size() == 2);
    auto& actor = views.at("actor");
    auto& critic = views.at("critic");
    actor.call(&test::CounterRole::bump);
    actor.call(&test::CounterRole::bump);
    critic.call(&test::CounterRole::bump);
    std::vector<int> a = actor.call(&test::CounterRole::value);
    std::vector<int> c = critic.call(&test::CounterRole::value);
    CHECK(a == std::vector<int>{2, 2});
    CHECK(c == std::vector<int>{10, 10});
    // The same workers: the bundle sees the roles' state under prefixed names.
    CHECK(from_value<std::vector<int>>(bundle.call("critic_value"), "v") == std::vector<int>{10, 10});
    std::vector<std::string> where = actor.call(&test::CounterRole::device_and_rank);
    CHECK(where[1] == "cpu#1");
  }
  SECTION("three roles, one fused") {
    auto views = bundle.spawn({"actor", "critic", "ref"}, /*fused=*/true);
    REQUIRE(views.size() == 3);
    views.at("actor").call(&test::CounterRole::bump);
    CHECK(from_value<std::vector<int>>(views.at("actor").call("value"), "v")[0] == 1);
    DataProto scaled = views.at("ref").call(&test::ScaleRole::scale, make_batch(4));
    CHECK(torch::equal(scaled.batch.at("x"), make_batch(4).batch.at("x") * 3));
    double factor = views.at("ref").call(&test::ScaleRole::factor);
    CHECK(factor == 3.0);
  }
  CHECK_THROWS_AS(bundle.spawn({"rm"}), KeyError);
}

TEST_CASE("a throwing method surfaces once, naming method, rank and message; the worker stays usable") {
  auto wg = echo_group(3);
  try {
    wg.call("throw_on_rank", 1);
    FAIL("no exception");
  } catch (const CallError& e) {
    CHECK(e.method() == "throw_on_rank");
    CHECK(e.rank() == 1);
    CHECK_THAT(e.what(), Catch::Contains("rank 1 of 3") && Catch::Contains("KeyError") &&
                             Catch::Contains("missing key 'values'"));
  }
  std::vector<int> ok = wg.call(&EchoWorker::throw_on_rank, -1);
  CHECK(ok == std::vector<int>{0, 1, 2});
}

TEST_CASE("an unknown worker type fails before launching, listing the registered types") {
  CHECK_THROWS_WITH(WorkerGroup(runtime(), ResourcePool({2}), WorkerSpec{"NoSuchWorker", Json::object()}),
                    Catch::Contains("'NoSuchWorker'") && Catch::Contains("EchoWorker"));
}

TEST_CASE("a constructor failure names the rank") {
  CHECK_THROWS_WITH(echo_group(3, {{"fail_on_rank", 2}}),
                    Catch::Contains("rank 2") && Catch::Contains("refusing to start"));
}

TEST_CASE("a worker that dies mid-call fails the call within seconds, naming it; later calls fail fast") {
  auto wg = echo_group(3);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    wg.call("crash_on_rank", 2, 200);
    FAIL("no exception");
  } catch (const WorkerDiedError& e) {
    CHECK(e.rank() == 2);
    CHECK_THAT(e.what(), Catch::Contains("crash_on_rank") && Catch::Contains("EchoWorker_0:2") &&
                             Catch::Contains("simulated crash"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  CHECK_FALSE(wg.alive(2));
  CHECK(wg.alive(1));
  CHECK_THROWS_WITH(wg.call("noop"), Catch::Contains("rank 2") && Catch::Contains("dead"));
}

TEST_CASE("a killed worker fails later calls naming its rank") {
  auto wg = echo_group(2);
  wg.kill_worker(1);
  const auto t0 = std::chrono::steady_clock::now();
  while (wg.alive(1) && std::chrono::steady_clock::now() - t0 < 2s) std::this_thread::sleep_for(5ms);
  CHECK_THROWS_AS(wg.call("noop"), WorkerDiedError);
  CHECK_THROWS_WITH(wg.call("noop"), Catch::Contains("rank 1") && Catch::Contains("killed"));
}

TEST_CASE("the watchdog names the method and the ranks that have not answered") {
  SECTION("failing the call") {
    auto wg = echo_group(3, Json::object(), {.call_deadline = 150ms});
    try {
      wg.call("sleep_on_rank", 1, 800);
      FAIL("no exception");
    } catch (const CallTimeoutError& e) {
      CHECK(e.ranks() == std::vector<int>{1});
      CHECK_THAT(e.what(), Catch::Contains("sleep_on_rank") && Catch::Contains("rank(s) 1"));
    }
  }
  SECTION("reporting through a callback while the call completes") {
    std::mutex m;
    std::vector<DeadlineReport> reports;
    auto wg = echo_group(2, Json::object(), {.on_deadline = [&](const DeadlineReport& r) {
                                               std::lock_guard lock(m);
                                               reports.push_back(r);
                                             }});
    std::vector<int> out = wg.call(CallOptions{.deadline = 100ms}, &EchoWorker::sleep_on_rank, 0, 400);
    CHECK(out == std::vector<int>{0, 1});
    std::lock_guard lock(m);
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].method == "sleep_on_rank");
    CHECK(reports[0].ranks == std::vector<int>{0});
  }
}

#ifdef HYFLOW_TEST_WORKERS_PARALLEL
TEST_CASE("an all-reduce inside a method across 4 workers") {
  auto wg = echo_group(4);
  std::vector<double> sums = wg.call(&EchoWorker::all_reduce_rank);
  CHECK(sums == std::vector<double>{10, 10, 10, 10});
  std::vector<double> again = wg.call(&EchoWorker::all_reduce_rank);  // the group is reused
  CHECK(again == sums);
}
#endif

TEST_CASE("detached workers outlive their group and re-attach by name") {
  std::vector<std::string> names;
  {
    auto wg = echo_group(2, Json::object(), {.name_prefix = "keep_", .detached = true});
    wg.call("set_state", 42);
    names = wg.worker_names();
  }
  auto again = WorkerGroup::from_detached(runtime(), names);
  std::vector<int> state = again.call(&EchoWorker::get_state);
  CHECK(state == std::vector<int>{42, 42});
  CHECK_THROWS_WITH(WorkerGroup::from_detached(runtime(), {"nope"}), Catch::Contains("'nope'"));
}

TEST_CASE("10,000 small calls do not grow memory; per-call timing is reported") {
  auto wg = echo_group(2);
  for (int i = 0; i < 500; ++i) wg.call("noop");
  const long before = rss_kb();
  for (int i = 0; i < 10000; ++i) wg.call("noop");
  const long after = rss_kb();
  CHECK(after - before < 8 * 1024);  // KiB: no per-call leak (10k calls x 1 KiB would be 10 MiB)
  auto timing = wg.last_timing();
  CHECK(timing.method == "noop");
  CHECK(timing.rank_us.size() == 2);
  CHECK(timing.total_us >= timing.execute_us);
}
