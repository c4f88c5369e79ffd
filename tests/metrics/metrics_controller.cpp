// The controller of the metrics scripts (promtool_check.sh, prometheus_scrape.sh): connects to
// the caf-nodes given on the command line, runs EchoWorker calls on one worker per node (small
// ones, and one batch above the data plane's 1 MiB threshold both ways), prints "controller
// ready" and keeps its connections (and so the nodes' heartbeat series) until stdin closes.
// Usage: metrics_controller SECRET_FILE HOST:PORT...
#include "test_workers.hpp"

#include <hyflow/cluster/all.hpp>

#include <iostream>

using namespace hyflow;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: metrics_controller SECRET_FILE HOST:PORT...\n";
    return 2;
  }
  try {
    test::register_test_workers();
    RuntimeOptions options;
    options.network = true;  // CAF's middleman, as a controller of caf-nodes needs
    auto rt = std::make_unique<Runtime>(options);
    std::vector<std::string> nodes(argv + 2, argv + argc);
    auto cluster =
        cluster::RemoteLauncher::connect(*rt, {.nodes = nodes, .secret = cluster::read_secret_file(argv[1])});
    rt->set_launcher(cluster);
    {
      WorkerGroup wg(*rt, cluster->pool(1), WorkerSpec{"EchoWorker", Json::object()});
      for (int i = 0; i < 5; ++i) wg.call(&test::EchoWorker::double_x, test::make_batch(8));
      DataProto big = wg.call(&test::EchoWorker::double_x, test::make_batch(2 * 65536, 4));  // 2 x 1 MiB
      if (big.size() != 2 * 65536)
        throw Error("the large batch came back with " + std::to_string(big.size()) + " rows");
      std::cout << "controller ready" << std::endl;
      std::string line;
      while (std::getline(std::cin, line)) {
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "metrics_controller: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
