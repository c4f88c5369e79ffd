// A CAF application that places workers of its own type on a caf-node (docs/embedding.md,
// "Workers on caf-nodes from the application's actor system"):
//   - its own actor system, whose config carries hyflow's types and the network settings
//     (Runtime::register_types, Runtime::configure_network),
//   - hyflow::Runtime(system) and RemoteLauncher::connect on it,
//   - a group of app.TextScorer (examples/embedded_cluster_workers.cpp, loaded by the node with
//     --plugin) called from an event-based actor with hyflow::request(self, group, timeout, ...).
// Usage: example_embedded_cluster HOST:PORT [SECRET_FILE]. Run as a test by with_caf_node.sh,
// which starts the node.
#include "embedded_cluster_workers.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/actors/group_actor.hpp>
#include <hyflow/cluster/all.hpp>

#include <caf/all.hpp>

#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace app {

struct Config : caf::actor_system_config {
  Config() {
    hyflow::Runtime::register_types(*this);     // DataProto, Value, the "hyflow" error category
    hyflow::Runtime::configure_network(*this);  // middleman, sharing scheduler, heartbeats as caf-node's
  }
};

using go_atom = caf::atom_constant<caf::atom("go")>;

/// Asks the scorers where they run and what a text scores, in CAF's order (destination,
/// timeout, message), and answers the caller with a report or the error.
caf::behavior caller(caf::event_based_actor* self, hyflow::WorkerGroup scorers) {
  return {[=](go_atom, const std::string& text) {
    auto promise = self->make_response_promise<std::string>();
    auto fail = [=](caf::error& e) mutable {
      promise.deliver("error " + hyflow::error_kind(e) + ": " + hyflow::error_message(e));
    };
    hyflow::request(self, scorers, std::chrono::seconds(30), &TextScorer::where)
        .then(
            [=](std::vector<std::string> places) mutable {
              hyflow::request(self, scorers, std::chrono::seconds(30), &TextScorer::score, text)
                  .then(
                      [=](std::vector<double> scores) mutable {
                        std::string report;
                        for (size_t r = 0; r < places.size(); ++r)
                          report += places[r] + ": score " + std::to_string(scores[r]) + "\n";
                        promise.deliver(report);
                      },
                      fail);
            },
            fail);
    return promise;
  }};
}

}  // namespace app

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s HOST:PORT [SECRET_FILE]\n", argv[0]);
    return 2;
  }
  app::Config cfg;
  caf::actor_system system{cfg};
  std::string report;
  {
    hyflow::Runtime runtime(system);
    namespace cl = hyflow::cluster;
    auto nodes = cl::RemoteLauncher::connect(
        runtime, {.nodes = {argv[1]}, .secret = argc > 2 ? cl::read_secret_file(argv[2]) : std::string()});
    hyflow::WorkerGroup scorers(runtime, nodes->pool(2), {"app.TextScorer", {{"scale", 0.5}}},
                                hyflow::WorkerGroupOptions{.launcher = nodes});
    auto actor = system.spawn(app::caller, scorers);
    caf::scoped_actor self{system};
    self->request(actor, caf::infinite, app::go_atom::value, std::string("twelve chars"))
        .receive([&](std::string& r) { report = r; }, [&](caf::error& e) { report = "error " + system.render(e); });
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  }  // ~Runtime: the node session ends, the workers stop
  const bool failed = report.rfind("error", 0) == 0 ||
                      report.find("in process " + std::to_string(::getpid()) + ":") != std::string::npos;
  std::printf("application process %d\n%s%s\n", static_cast<int>(::getpid()), report.c_str(),
              failed ? "failed (an error, or workers in the application's process)" : "clean shutdown");
  return failed ? 1 : 0;
}
