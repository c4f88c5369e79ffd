// caf-node: one per machine. Runs a node manager that spawns registered worker types for
// controllers that prove knowledge of the shared secret; stops on SIGINT/SIGTERM. Worker types
// of your own come in as plugins: --plugin=libmy_workers.so (shared libraries whose static
// initializers call register_worker_type / HYFLOW_REGISTER_WORKER; docs/embedding.md).
//
// The same file builds the tests' and benches' node, hyflow-test-node (tests/cluster), with
// HYFLOW_TEST_NODE: it hosts the test workers (EchoWorker, CounterRole, ScaleRole,
// CollectiveWorker) and the bench worker instead of the role workers. The shipped caf-node hosts no test code.
#include <hyflow/cluster/all.hpp>
#include <hyflow/core/shared_library.hpp>
#include <hyflow/metrics/server.hpp>

#ifdef HYFLOW_TEST_NODE
#include "collective_worker.hpp"
#include "test_workers.hpp"
#endif

#ifdef HYFLOW_NODE_HAS_WORKERS
#include <hyflow/workers/register.hpp>
#endif

#include <boost/program_options.hpp>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <unistd.h>

namespace po = boost::program_options;

namespace {
/// Loads a worker plugin and returns the worker types it registered. ValueError when it
/// registered none: a library that is no worker plugin (libm.so.6), or one loaded already.
std::vector<std::string> load_worker_plugin(const std::string& path) {
  const auto before = hyflow::actors::worker_type_names();
  hyflow::load_shared_library(path, "worker plugin");
  std::vector<std::string> added;
  for (auto& name : hyflow::actors::worker_type_names())
    if (!std::binary_search(before.begin(), before.end(), name)) added.push_back(std::move(name));
  if (added.empty())
    throw hyflow::ValueError("worker plugin " + path +
                             " registers no worker type (a plugin registers its worker types when it is loaded, with "
                             "HYFLOW_REGISTER_WORKER; docs/cluster.md, \"Your own worker types on caf-node\")");
  return added;
}
}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("caf-node options");
  desc.add_options()("help,h", "print this help")(
      "bind", po::value<std::string>()->default_value("127.0.0.1"),
      "address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)")(
      "port,p", po::value<int>()->default_value(0), "TCP port (0: a free one, printed on stdout)")(
      "secret-file", po::value<std::string>(),
      "file holding the shared secret controllers must prove (challenge-response); without it any controller that can "
      "reach the port is served")(
      "heartbeat-ms", po::value<int>()->default_value(500),
      "middleman heartbeat interval in ms (0: off; must match the controller's)")(
      "connection-timeout-ms", po::value<int>()->default_value(3000),
      "drop a peer silent for this long (0: never; needs heartbeats on both ends; must exceed the longest single "
      "message transfer)")(
      "threads", po::value<int>()->default_value(0), "CAF scheduler threads (0: CAF's default)")(
      "max-message-mb", po::value<int>()->default_value(2048),
      "largest CAF message a peer may send, in MiB (1..4096): a larger one closes its connection, logged")(
      "tls-cert", po::value<std::string>(),
      "mutual TLS: this node's certificate (PEM); needs --tls-key and --tls-ca as well")(
      "tls-key", po::value<std::string>(), "mutual TLS: the private key of --tls-cert (PEM, unencrypted)")(
      "tls-ca", po::value<std::string>(),
      "mutual TLS: the CA certificate (PEM) that signed the controllers' certificates; others are refused")(
      "exit-with-parent", "stop (as on SIGTERM) when the process that started this one exits (tests, supervisors)")(
      "plugin", po::value<std::vector<std::string>>()->composing(),
      "shared library whose static initializers register worker types (repeatable); loaded before listening, "
      "so a library that fails to load stops the node")(
      "metrics-port", po::value<int>()->default_value(0),
      "serve Prometheus metrics on GET /metrics at this TCP port (0: off; docs/metrics.md)")(
      "metrics-bind", po::value<std::string>()->default_value("127.0.0.1"),
      "address of the metrics endpoint (an address other than loopback needs --metrics-token-file)")(
      "metrics-token-file", po::value<std::string>(),
      "file holding the bearer token every metrics request must carry (Authorization: Bearer <token>)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "caf-node: " << e.what() << "\n" << desc << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << "caf-node: hosts hyflow workers for a remote controller\n" << desc << "\n";
    return 0;
  }
  hyflow::cluster::NodeOptions options;
  options.bind = vm["bind"].as<std::string>();
  options.port = vm["port"].as<int>();
  options.heartbeat_interval_ms = vm["heartbeat-ms"].as<int>();
  options.connection_timeout_ms = vm["connection-timeout-ms"].as<int>();
  options.scheduler_threads = vm["threads"].as<int>();
  const int max_message_mb = vm["max-message-mb"].as<int>();
  if (max_message_mb < 1 || max_message_mb > 4096) {
    std::cerr << "caf-node: --max-message-mb " << max_message_mb << " is out of range (1..4096)\n";
    return 2;
  }
  options.max_message_bytes = static_cast<uint64_t>(max_message_mb) << 20;
  if (options.port < 0 || options.port > 65535) {
    std::cerr << "caf-node: --port " << options.port << " is out of range\n";
    return 2;
  }
  auto flag = [&](const char* name) { return vm.count(name) ? vm[name].as<std::string>() : std::string(); };
  options.tls = {flag("tls-cert"), flag("tls-key"), flag("tls-ca")};
  hyflow::metrics::ServerOptions metrics_options;
  metrics_options.bind = vm["metrics-bind"].as<std::string>();
  metrics_options.port = vm["metrics-port"].as<int>();
  if (metrics_options.port < 0 || metrics_options.port > 65535) {
    std::cerr << "caf-node: --metrics-port " << metrics_options.port << " is out of range (0: off)\n";
    return 2;
  }
  try {
    if (vm.count("metrics-token-file"))
      metrics_options.token = hyflow::metrics::read_token_file(vm["metrics-token-file"].as<std::string>());
    if (metrics_options.port > 0 && metrics_options.token.empty() &&
        !hyflow::metrics::is_loopback(metrics_options.bind))
      throw hyflow::ValueError("--metrics-bind " + metrics_options.bind +
                               " is not a loopback address: it needs --metrics-token-file");
    if (vm.count("secret-file"))
      options.secret = hyflow::cluster::read_secret_file(vm["secret-file"].as<std::string>());
    if (vm.count("plugin"))
      for (const auto& path : vm["plugin"].as<std::vector<std::string>>()) {
        std::string types;
        for (const auto& t : load_worker_plugin(path)) types += (types.empty() ? "" : ", ") + t;
        hyflow::cluster::cluster_log("loaded worker plugin " + path + ": worker types " + types);
      }
    // A bad TLS file makes CAF abort at the first connection: check them all before starting.
    hyflow::cluster::check_tls_files(options.tls, {"--tls-cert", "--tls-key", "--tls-ca"});
  } catch (const std::exception& e) {
    std::cerr << "caf-node: " << e.what() << "\n";
    return 2;
  }
#ifdef HYFLOW_TEST_NODE
  test::register_test_workers();
  test::register_collective_worker();
#endif
#ifdef HYFLOW_NODE_HAS_WORKERS
  hyflow::workers::register_workers();  // ActorRolloutRefWorker, CriticWorker, RewardModelWorker
#endif

  // Block the stop signals in every thread (CAF's threads inherit the mask) and wait for them here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  if (vm.count("exit-with-parent")) {
    const pid_t parent = getppid();
    std::thread([parent] {
      while (getppid() == parent) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      hyflow::cluster::cluster_log("parent process exited");
      kill(getpid(), SIGTERM);
    }).detach();
  }
  int signal = 0;
  try {
    hyflow::cluster::NodeServer server(options);
    if (options.secret.empty())
      hyflow::cluster::cluster_log(
          "warning: no --secret-file: any controller that reaches this port can run workers here");
    const auto& info = server.info();
    std::string gpus = std::to_string(info.gpus) + " GPUs";
    for (size_t i = 0; i < info.gpu_names.size(); ++i)
      gpus += (i == 0 ? ": " : ", ") + info.gpu_names[i] +
              (i < info.gpu_memory_bytes.size()
                   ? " " + std::to_string(info.gpu_memory_bytes[i] / (1024 * 1024)) + " MiB"
                   : std::string());
    hyflow::metrics::Registry registry;
    std::unique_ptr<hyflow::metrics::Server> metrics_server;
    if (metrics_options.port > 0) {  // before the listening line: a port in use stops the node first
      hyflow::cluster::add_node_metrics(registry, server);
      metrics_server = std::make_unique<hyflow::metrics::Server>(registry, metrics_options);
      hyflow::cluster::cluster_log("metrics on http://" + metrics_server->address() + "/metrics" +
                                   (metrics_options.token.empty() ? "" : " (bearer token required)"));
    }
    hyflow::cluster::cluster_log("listening on " + info.address + (options.tls.empty() ? "" : " over mutual TLS") +
                        " (host " + info.hostname + ", " + std::to_string(info.cpus) + " CPUs, " + gpus + ")");
    std::cout << "caf-node listening on " << options.bind << ":" << server.port() << std::endl;
    sigwait(&stop, &signal);
    const std::string received = std::string("caf-node received ") + (signal == SIGINT ? "SIGINT" : "SIGTERM");
    hyflow::cluster::cluster_log(received + ", shutting down");
    metrics_server.reset();  // its collectors read the node: no scrape during the shutdown
    server.shutdown(received + " and shut down");
    // A worker stuck in a long method cannot be preempted: give shutdown 10 s, then leave.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      hyflow::cluster::cluster_log("shutdown still waiting for a running worker method after 10 s; exiting");
      _exit(1);
    }).detach();
  } catch (const std::exception& e) {
    hyflow::cluster::cluster_log(std::string("error: ") + e.what());
    return 1;
  }
  hyflow::cluster::cluster_log("stopped");
  return 0;
}
