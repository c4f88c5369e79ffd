// Multi-process: caf-node children on 127.0.0.1 host the workers of a group.
#include "collective_worker.hpp"
#include "node_process.hpp"
#include "test_workers.hpp"

#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/cluster/all.hpp>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

using namespace hyflow;
using namespace hyflow::cluster;
using namespace std::chrono_literals;

namespace {

std::string write_secret(const std::string& name, const std::string& secret) {
  std::string path = "/tmp/hyflow-cluster-test-" + std::to_string(getpid()) + "-" + name;
  std::ofstream(path) << secret << "\n";
  return path;
}

}  // namespace

TEST_CASE("2 caf-nodes host a group of 4 workers; ranks follow node address order then local rank") {
  test::register_test_workers();
  test::NodeProcess a, b;
  const auto& low = a.port() < b.port() ? a : b;
  const auto& high = a.port() < b.port() ? b : a;
  auto rt = test::network_runtime();
  {
    // Listed high first: placement must not depend on the listing order.
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {high.address(), low.address()}});
    REQUIRE(cluster->nodes().size() == 2);
    CHECK(cluster->nodes()[0].address == low.address());
    CHECK(cluster->nodes()[0].cpus >= 1);
    CHECK(cluster->nodes()[0].protocol_version == kNodeProtocolVersion);
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});

    // ONE_TO_ALL across processes
    std::vector<std::string> who = wg.call(&test::EchoWorker::whoami);
    CHECK(who == std::vector<std::string>{"rank 0/4", "rank 1/4", "rank 2/4", "rank 3/4"});
    auto list = from_value<std::vector<Json>>(wg.call("worker_env"), "worker_env");
    REQUIRE(list.size() == 4);
    int master_port = -1;
    for (int r = 0; r < 4; ++r) {
      const Json& e = list[static_cast<size_t>(r)];
      const auto& host = r < 2 ? low : high;
      CHECK(e.at("NAME").get<std::string>().find("@" + host.address()) != std::string::npos);
      CHECK(e.at("LOCAL_RANK").get<int>() == r % 2);
      CHECK(e.at("MASTER_ADDR").get<std::string>() == "127.0.0.1");
      if (r == 0) master_port = e.at("MASTER_PORT").get<int>();
      CHECK(e.at("MASTER_PORT").get<int>() == master_port);
    }
    CHECK(master_port > 0);

    // DP_COMPUTE_PROTO across processes: 8 rows, 2 per rank
    DataProto batch = test::make_batch(8);
    DataProto out = wg.call(&test::EchoWorker::double_x, batch);
    CHECK(out.size() == 8);
    CHECK(torch::equal(out.batch.at("x"), batch.batch.at("x") * 2));
    CHECK(torch::equal(out.batch.at("rank"), torch::tensor({0, 0, 1, 1, 2, 2, 3, 3}, torch::kInt64)));

    // Worker errors come back with rank and message.
    try {
      wg.call(&test::EchoWorker::throw_on_rank, 3);
      FAIL("expected a CallError");
    } catch (const CallError& e) {
      CHECK(e.rank() == 3);
      CHECK(std::string(e.what()).find("missing key 'values' on purpose") != std::string::npos);
    }
  }
  rt.reset();
}

TEST_CASE("a node that is not listening gives a connect error naming it, in well under the timeout") {
  auto rt = test::network_runtime();
  const std::string addr = "127.0.0.1:" + std::to_string(test::closed_port());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    RemoteLauncher::connect(*rt, {.nodes = {addr}});
    FAIL("expected a ClusterError");
  } catch (const ClusterError& e) {
    CHECK(std::string(e.what()).find("cannot connect to node " + addr) != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  CHECK_THROWS_AS(parse_node_list("127.0.0.1:70000"), ValueError);
  CHECK(parse_node_list(" a:1, b:2 ") == std::vector<std::string>{"a:1", "b:2"});
  rt.reset();
}

TEST_CASE("a runtime without networking cannot place remote workers") {
  Runtime rt;
  CHECK_THROWS_AS(RemoteLauncher::connect(rt, {.nodes = {"127.0.0.1:1"}}), ValueError);
}

TEST_CASE("a node with a secret serves the right secret and refuses a wrong or missing one") {
  test::register_test_workers();
  const std::string file = write_secret("node", "correct horse battery staple");
  test::NodeProcess node({"--secret-file=" + file});
  auto rt = test::network_runtime();
  {
    try {
      RemoteLauncher::connect(*rt, {.nodes = {node.address()}, .secret = "wrong"});
      FAIL("expected a ClusterError");
    } catch (const ClusterError& e) {
      CHECK(std::string(e.what()).find("authentication failed") != std::string::npos);
      CHECK(std::string(e.what()).find(node.address()) != std::string::npos);
    }
    try {
      RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
      FAIL("expected a ClusterError");
    } catch (const ClusterError& e) {
      CHECK(std::string(e.what()).find("requires a shared secret") != std::string::npos);
    }
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}, .secret = read_secret_file(file)});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});
    std::vector<std::string> who = wg.call(&test::EchoWorker::whoami);
    CHECK(who == std::vector<std::string>{"rank 0/2", "rank 1/2"});
  }
  rt.reset();
  std::remove(file.c_str());
  // The proof is an HMAC of the challenge: it depends on both and never equals the secret.
  CHECK(challenge_proof("s", "n1") != challenge_proof("s", "n2"));
  CHECK(challenge_proof("s", "n1") != challenge_proof("t", "n1"));
  CHECK(challenge_proof("s", "n1").size() == 64);
}

TEST_CASE("a pool that needs more nodes than the cluster has is a shortfall naming both counts") {
  test::NodeProcess node;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
    try {
      cluster->pool(std::vector<int>{1, 1});
      FAIL("expected a ClusterError");
    } catch (const ClusterError& e) {
      CHECK(std::string(e.what()).find("needs 2 nodes, the cluster has 1") != std::string::npos);
    }
    CHECK_THROWS_AS(cluster->pool(1, /*use_gpu=*/true), ClusterError);
  }
  rt.reset();
}

TEST_CASE("kill -9 of a node mid-call fails the call within 5 s naming the node and the rank") {
  test::register_test_workers();
  test::NodeProcess a, b;
  const auto& low = a.port() < b.port() ? a : b;
  auto& high = a.port() < b.port() ? b : a;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {low.address(), high.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});
    // rank 2 (on the high node) sleeps 20 s; the others answer at once.
    auto pending = std::async(std::launch::async, [&] { return wg.call("sleep_on_rank", 2, 20000); });
    std::this_thread::sleep_for(300ms);
    const auto t0 = std::chrono::steady_clock::now();
    high.signal(SIGKILL);
    REQUIRE(pending.wait_for(5s) == std::future_status::ready);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    try {
      pending.get();
      FAIL("expected a WorkerDiedError");
    } catch (const WorkerDiedError& e) {
      CHECK(e.rank() == 2);
      CHECK(std::string(e.what()).find("rank 2") != std::string::npos);
      CHECK(std::string(e.what()).find(high.address()) != std::string::npos);
      // the node and every rank it held, not CAF's remote_link_unreachable for one worker
      CHECK_THAT(e.what(), Catch::Contains("node " + high.address() + " is unreachable") &&
                               Catch::Contains("ranks 2, 3 of 4 were on it") &&
                               !Catch::Contains("remote_link_unreachable"));
    }
    // Later calls fail at once; the survivors still answer nothing partial.
    CHECK_THROWS_AS(wg.call(&test::EchoWorker::whoami), WorkerDiedError);
  }
  rt.reset();
}

TEST_CASE("a pool built after a node died leaves it out at once, naming it; the live node still serves") {
  test::register_test_workers();
  test::NodeProcess a, b;
  const auto& low = a.port() < b.port() ? a : b;
  auto& high = a.port() < b.port() ? b : a;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {low.address(), high.address()}});
    rt->set_launcher(cluster);
    high.signal(SIGKILL);
    // The launcher learns of the death from the broken connection (tens of milliseconds).
    bool refused = false;
    std::string what;
    for (int i = 0; i < 100 && !refused; ++i) {
      try {
        cluster->pool(1);
        std::this_thread::sleep_for(50ms);
      } catch (const ClusterError& e) {
        refused = true;
        what = e.what();
      }
    }
    REQUIRE(refused);
    CHECK_THAT(what, Catch::Contains("node " + high.address() + " is down"));
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(WorkerGroup(*rt, ResourcePool({1, 1}), WorkerSpec{"EchoWorker", Json::object()}),
                      Catch::Contains(high.address() + " is down"));
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);  // not a spawn timeout
    WorkerGroup wg(*rt, cluster->pool(std::vector<int>{2}), WorkerSpec{"EchoWorker", Json::object()});
    std::vector<std::string> who = wg.call(&test::EchoWorker::whoami);
    CHECK(who == std::vector<std::string>{"rank 0/2", "rank 1/2"});
  }
  rt.reset();
}

TEST_CASE("with heartbeats, a SIGSTOPped node fails the pending call within 5 s naming node and rank") {
  test::register_test_workers();
  const std::vector<std::string> hb{"--heartbeat-ms=200", "--connection-timeout-ms=1500"};
  test::NodeProcess a(hb), b(hb);
  const auto& low = a.port() < b.port() ? a : b;
  auto& high = a.port() < b.port() ? b : a;
  RuntimeOptions o;
  o.network = true;
  o.heartbeat_interval_ms = 200;
  o.connection_timeout_ms = 1500;
  auto rt = std::make_unique<Runtime>(o);
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {low.address(), high.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});
    auto pending = std::async(std::launch::async, [&] { return wg.call("sleep_on_rank", 3, 4000); });
    std::this_thread::sleep_for(300ms);
    const auto t0 = std::chrono::steady_clock::now();
    high.signal(SIGSTOP);
    REQUIRE(pending.wait_for(5s) == std::future_status::ready);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    try {
      pending.get();
      FAIL("expected a WorkerDiedError");
    } catch (const WorkerDiedError& e) {
      CHECK(e.rank() == 3);  // rank 2 (same node) answered before the stop
      CHECK(std::string(e.what()).find(high.address()) != std::string::npos);
    }
    high.signal(SIGCONT);
  }
  rt.reset();
}

TEST_CASE("with the default networked configuration, a SIGSTOPped node fails the pending call within 5 s") {
  test::register_test_workers();
  test::NodeProcess a, b;  // no heartbeat flags: caf-node's defaults
  const auto& low = a.port() < b.port() ? a : b;
  auto& high = a.port() < b.port() ? b : a;
  auto rt = test::network_runtime();  // RuntimeOptions{.network = true}: its defaults
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {low.address(), high.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});
    auto pending = std::async(std::launch::async, [&] { return wg.call("sleep_on_rank", 3, 20000); });
    std::this_thread::sleep_for(300ms);
    high.signal(SIGSTOP);
    REQUIRE(pending.wait_for(5s) == std::future_status::ready);
    try {
      pending.get();
      FAIL("expected a WorkerDiedError");
    } catch (const WorkerDiedError& e) {
      CHECK(e.rank() == 3);
      CHECK(std::string(e.what()).find(high.address()) != std::string::npos);
    }
    high.signal(SIGCONT);
  }
  rt.reset();
}

namespace {
/// Ranks 0-1 on the low node wait in a gloo all-reduce for rank 2 (high node), which sleeps
/// first; `stop` then kills or stops the high node. The call must fail within 5 s naming a rank
/// of the high node, not a survivor (gloo's own timeout would blame rank 0 after 30 s).
void check_collective_failure(int stop_signal) {
  test::register_collective_worker();
  test::NodeProcess a, b;  // caf-node's default heartbeats
  const auto& low = a.port() < b.port() ? a : b;
  auto& high = a.port() < b.port() ? b : a;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {low.address(), high.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"CollectiveWorker", Json::object()});
    REQUIRE(from_value<std::vector<int>>(wg.call("join"), "join") == std::vector<int>{0, 1, 2, 3});
    const auto reports = std::filesystem::temp_directory_path() /
                         ("hyflow-collective-" + std::to_string(::getpid()) + "-" + std::to_string(stop_signal));
    std::filesystem::remove_all(reports);
    std::filesystem::create_directories(reports);
    auto pending =
        std::async(std::launch::async, [&] { return wg.call("late_all_reduce_reported", 2, 20000, reports.string()); });
    std::this_thread::sleep_for(500ms);  // ranks 0, 1, 3 are inside the all-reduce now
    const auto t0 = std::chrono::steady_clock::now();
    high.signal(stop_signal);
    REQUIRE(pending.wait_for(5s) == std::future_status::ready);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    try {
      pending.get();
      FAIL("expected a WorkerDiedError");
    } catch (const WorkerDiedError& e) {
      CHECK((e.rank() == 2 || e.rank() == 3));
      // Ranks 2 and 3 both died (either may be reported first, the other counted); a survivor
      // on the low node is never the one named.
      CHECK_THAT(e.what(), Catch::Contains("@" + high.address()) && !Catch::Contains("@" + low.address()));
    }
    // The survivors (ranks 0 and 1, on the low node) do not stay inside gloo until its own 30 s
    // timeout: their process group notices that ranks 2 and 3 stopped signalling and aborts
    // the collective, naming one of them.
    for (int survivor : {0, 1}) {
      const auto report = reports / ("rank" + std::to_string(survivor));
      const auto deadline = std::chrono::steady_clock::now() + 15s;
      while (!std::filesystem::exists(report) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(50ms);
      REQUIRE(std::filesystem::exists(report));
      std::this_thread::sleep_for(50ms);  // the worker writes it in one go; let it close the file
      std::ifstream in(report);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      INFO("rank " << survivor << ": " << text);
      CHECK(text.rfind("error ", 0) == 0);
      if (stop_signal == SIGSTOP)
        CHECK_THAT(text, Catch::Contains("was aborted: rank 2") || Catch::Contains("was aborted: rank 3"));
      else  // the liveness check's abort, or gloo's "Connection closed by peer [addr]:port" (which alone
            // names no rank) followed by the liveness verdict
        CHECK_THAT(text, Catch::Contains("was aborted: rank 2") || Catch::Contains("was aborted: rank 3") ||
                             Catch::Contains("failed: rank 2") || Catch::Contains("failed: rank 3"));
      // the dead rank's node and all of its ranks
      CHECK_THAT(text, Catch::Contains("it ran on node " + high.address() + ", which holds ranks 2, 3"));
    }
    std::filesystem::remove_all(reports);
    // The surviving node serves a new group at once, with its own collective, although the old
    // workers may still wait inside gloo (each worker has a thread of its own).
    WorkerGroup again(*rt, cluster->pool(std::vector<int>{2}), WorkerSpec{"CollectiveWorker", Json::object()});
    CHECK(from_value<std::vector<int>>(again.call("join"), "join") == std::vector<int>{0, 1});
    CHECK(from_value<std::vector<double>>(again.call("late_all_reduce", -1, 0), "sum") ==
          std::vector<double>{3.0, 3.0});
    high.signal(SIGCONT);
  }
  rt.reset();
}
}  // namespace

TEST_CASE("kill -9 of a node while the others wait in a gloo collective fails the call at once, naming its rank") {
  check_collective_failure(SIGKILL);
}

TEST_CASE("SIGSTOP of a node while the others wait in a gloo collective is named within 5 s by default") {
  check_collective_failure(SIGSTOP);
}

TEST_CASE("with heartbeats off, a SIGSTOPped node ends the call at the call deadline, naming its worker and node") {
  // Calls carry a deadline of their own, 10 minutes by default (verl's collective timeout)...
  CHECK(WorkerGroupOptions{}.call_deadline == std::chrono::minutes(10));
  // ...which a test shortens: no heartbeat will notice the stopped node.
  test::register_test_workers();
  const std::vector<std::string> no_heartbeats{"--heartbeat-ms=0", "--connection-timeout-ms=0"};
  test::NodeProcess a(no_heartbeats), b(no_heartbeats);
  const auto& low = a.port() < b.port() ? a : b;
  auto& high = a.port() < b.port() ? b : a;
  RuntimeOptions o;
  o.network = true;
  o.heartbeat_interval_ms = 0;
  o.connection_timeout_ms = 0;
  auto rt = std::make_unique<Runtime>(o);
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {low.address(), high.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()}, {.call_deadline = 2500ms});
    // rank 3 (high node) would answer after 1 s; the node is stopped before it does
    auto pending = std::async(std::launch::async, [&] { return wg.call("sleep_on_rank", 3, 1000); });
    std::this_thread::sleep_for(300ms);
    const auto t0 = std::chrono::steady_clock::now();
    high.signal(SIGSTOP);
    REQUIRE(pending.wait_for(6s) == std::future_status::ready);
    CHECK(std::chrono::steady_clock::now() - t0 < 4s);
    try {
      pending.get();
      FAIL("expected a CallTimeoutError");
    } catch (const CallTimeoutError& e) {
      CHECK(e.ranks() == std::vector<int>{3});
      CHECK_THAT(e.what(), Catch::Contains("no answer from rank(s) 3 (worker '") &&
                               Catch::Contains("@" + high.address() + "')"));
    }
    high.signal(SIGCONT);
  }
  rt.reset();
}

TEST_CASE("a gloo all-reduce runs across 2 node processes (MASTER_ADDR/PORT from the rank-0 node)") {
  test::register_test_workers();
  test::NodeProcess a, b;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {a.address(), b.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});
    std::vector<double> sums = wg.call(&test::EchoWorker::all_reduce_rank);
    CHECK(sums == std::vector<double>{10.0, 10.0, 10.0, 10.0});  // 1 + 2 + 3 + 4 on every rank
  }
  rt.reset();
}

TEST_CASE("colocated roles spawn across nodes and keep per-role state on each remote worker") {
  test::register_test_workers();
  test::NodeProcess a, b;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {a.address(), b.address()}});
    rt->set_launcher(cluster);
    auto spec = colocated_spec({{"counter", {"CounterRole", Json{{"step", 3}}}},
                                {"scale", {"ScaleRole", Json{{"factor", 2.0}}}}});
    WorkerGroup all(*rt, cluster->pool(1), spec);
    auto groups = all.spawn({"counter", "scale"});
    std::vector<int> once = groups.at("counter").call(&test::CounterRole::bump);
    std::vector<int> twice = groups.at("counter").call(&test::CounterRole::bump);
    CHECK(once == std::vector<int>{3, 3});
    CHECK(twice == std::vector<int>{6, 6});
    std::vector<std::string> where = groups.at("counter").call(&test::CounterRole::device_and_rank);
    CHECK(where == std::vector<std::string>{"cpu#0", "cpu#1"});
    DataProto batch = test::make_batch(4);
    DataProto scaled = groups.at("scale").call(&test::ScaleRole::scale, batch);
    CHECK(scaled.size() == 4);
  }
  rt.reset();
}

TEST_CASE("a remote worker that exits fails the call naming its rank; the node stays up") {
  test::register_test_workers();
  test::NodeProcess node;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});
    try {
      wg.call("crash_on_rank", 1, 0);
      FAIL("expected a WorkerDiedError");
    } catch (const WorkerDiedError& e) {
      CHECK(e.rank() == 1);
      CHECK(std::string(e.what()).find("simulated crash") != std::string::npos);
    }
    // The node still serves a new group.
    WorkerGroup again(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
    std::vector<std::string> who = again.call(&test::EchoWorker::whoami);
    CHECK(who == std::vector<std::string>{"rank 0/1"});
  }
  rt.reset();
}

TEST_CASE("SIGTERM stops a caf-node with exit status 0 and the controller sees its workers die") {
  test::register_test_workers();
  test::NodeProcess node;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {node.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
    node.signal(SIGTERM);
    int status = -1;
    REQUIRE(node.wait_exit(5s, status));
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    std::this_thread::sleep_for(200ms);
    // The truth, not CAF's "user_shutdown": which node, and that it was stopped by SIGTERM.
    CHECK_THROWS_WITH(wg.call(&test::EchoWorker::whoami),
                      Catch::Contains("node " + node.address() + ": caf-node received SIGTERM and shut down"));
  }
  rt.reset();
}

TEST_CASE("every dispatch mode works across 2 node processes") {
  test::register_test_workers();
  test::NodeProcess a, b;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {a.address(), b.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});
    CHECK(from_value<std::vector<int>>(wg.call("add_rank", 1), "one") == std::vector<int>{1, 2, 3, 4});  // ONE_TO_ALL
    const std::vector<int> inputs{10, 20, 30, 40};
    CHECK(from_value<std::vector<int>>(wg.call("add_rank_dp", per_rank(inputs)), "dp") ==
          std::vector<int>{10, 21, 32, 43});  // DP_COMPUTE
    CHECK(from_value<std::vector<int>>(wg.call("add_rank_all", per_rank(inputs)), "all") ==
          std::vector<int>{10, 21, 32, 43});  // ALL_TO_ALL
    CHECK(from_value<int>(wg.call("add_rank_zero", 5), "zero") == 5);  // execute RANK_ZERO
    auto metrics =
        from_value<std::vector<Json>>(wg.call("metrics", test::make_batch(8)), "metrics");  // DP_COMPUTE_METRIC
    REQUIRE(metrics.size() == 4);
    CHECK(metrics[3]["rank"] == 3);
    CHECK(metrics[3]["rows"] == 2);
    wg.call("register_mesh", "train", 2);  // nd compute: dp ranks 0,0,1,1
    DataProto batch = test::make_batch(8);
    DataProto nd = wg.call(&test::EchoWorker::nd_double_x, batch);
    CHECK(torch::equal(nd.batch.at("x"), batch.batch.at("x") * 2));
    DataProtoFuture first = wg.call(&test::EchoWorker::plus_one, batch);  // non-blocking, chained
    DataProtoFuture second = wg.call(&test::EchoWorker::plus_one, first);
    CHECK(torch::equal(second.get().batch.at("x"), batch.batch.at("x") + 2));
  }
  rt.reset();
}
