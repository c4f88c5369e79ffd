// caf-node --plugin: worker types of the user's own, in a shared library the shipped node
// loads at start; a library that cannot be loaded stops the node with the loader's reason.
#include "node_process.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/cluster/all.hpp>

#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

using namespace hyflow;
using namespace hyflow::cluster;

namespace {
/// Everything the node writes to stderr while `start` runs (a node child inherits this process's
/// stderr): fd 2 goes to a temporary file meanwhile.
template <class F>
std::string node_stderr_during(F start) {
  char path[] = "/tmp/hyflow_plugin_log_XXXXXX";
  const int file = ::mkstemp(path);
  REQUIRE(file >= 0);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(file, 2);
  try {
    start();
  } catch (...) {
    ::dup2(saved, 2);
    ::close(saved);
    ::close(file);
    ::unlink(path);
    throw;
  }
  ::dup2(saved, 2);
  ::close(saved);
  ::close(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(path);
  return text.str();
}
}  // namespace

TEST_CASE("the shipped caf-node hosts a worker type from a --plugin library") {
  std::unique_ptr<test::NodeProcess> started;
  const std::string log = node_stderr_during([&] {
    started =
        std::make_unique<test::NodeProcess>(std::vector<std::string>{std::string("--plugin=") + WORKER_PLUGIN_PATH});
  });
  CHECK_THAT(
      log, Catch::Contains(std::string("loaded worker plugin ") + WORKER_PLUGIN_PATH + ": worker types PluginWorker"));
  auto& node = *started;
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

TEST_CASE("caf-node refuses a --plugin library that registers no worker type, naming it") {
  // libm: a shared library that loads fine and registers nothing (the test links it)
  Dl_info info{};
  REQUIRE(::dladdr(reinterpret_cast<void*>(static_cast<double (*)(double)>(&::erfc)), &info) != 0);
  const std::string libm = info.dli_fname;
  REQUIRE_THAT(libm, Catch::Contains("libm"));
  std::string error;
  const std::string log = node_stderr_during([&] {
    try {
      test::NodeProcess node({"--plugin=" + libm});
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  CHECK_THAT(error, Catch::Contains("exited before listening"));
  CHECK_THAT(log, Catch::Contains("worker plugin " + libm + " registers no worker type"));
}
