// caf-node --plugin: worker types of the user's own, in a shared library the shipped node
// loads at start; a library that cannot be loaded stops the node with the loader's reason.
#include "node_process.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/cluster/all.hpp>

#include <catch2/catch.hpp>

#include <unistd.h>

using namespace hyflow;
using namespace hyflow::cluster;

TEST_CASE("the shipped caf-node hosts a worker type from a --plugin library") {
  test::NodeProcess node({std::string("--plugin=") + WORKER_PLUGIN_PATH});
  auto rt = test::network_runtime();
  {
    auto nodes = RemoteLauncher::connect(*rt, {.nodes = {"127.0.0.1:" + std::to_string(node.port())}});
    WorkerGroup wg(*rt, nodes->pool(2), {"PluginWorker", {{"greeting", "hi"}}}, {.launcher = nodes});
    auto greetings = from_value<std::vector<std::string>>(wg.call("greet", std::string("you")), "greet");
    CHECK(greetings == std::vector<std::string>{"hi you from rank 0", "hi you from rank 1"});
    const auto pid = from_value<int64_t>(wg.call("process_id"), "process_id");
    CHECK(pid != static_cast<int64_t>(::getpid()));  // it ran in the node
  }
  rt.reset();
}

TEST_CASE("a --plugin that cannot be loaded stops caf-node before it listens") {
  CHECK_THROWS_WITH(test::NodeProcess({"--plugin=/nonexistent/libnothing.so"}),
                    Catch::Contains("exited before listening"));
}
