// Multi-process: mutual TLS between controllers and caf-node (CAF's openssl module) with
// certificates made at test time by the openssl CLI.
#include "node_process.hpp"
#include "test_workers.hpp"
#include "tls_files.hpp"

#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/cluster/all.hpp>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

using namespace hyflow;
using namespace hyflow::cluster;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

struct Finished {
  int status = -1;
  std::string output;  // stdout and stderr
};

/// Runs caf-node with `args` (bounded to 20 s) and returns its exit status and output.
Finished run_node(const std::string& args) {
  const std::string cmd = "timeout 20 " CAF_NODE_PATH " --port=0 " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  Finished f;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) f.output.append(buf, n);
  const int st = pclose(p);
  f.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return f;
}

/// A bare CAF actor system with the openssl module and `files`: a TLS client that is not a
/// hyflow Runtime (an attacker holding a certificate), to see what a TLS node accepts.
struct TlsClientConfig : caf::actor_system_config {
  explicit TlsClientConfig(const test::TlsFiles& f) {
    load<caf::io::middleman>();
    load<caf::openssl::manager>();
    openssl_certificate = f.cert;
    openssl_key = f.key;
    openssl_cafile = f.ca;
  }
};

/// Connects with CAF's own TLS client and says hello to the node manager: its JSON answer, or
/// "error: ...".
std::string tls_hello(const test::TlsFiles& files, int port) {
  TlsClientConfig cfg(files);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::string out;
  caf::strong_actor_ptr manager;
  self->request(sys.openssl_manager().actor_handle(), caf::timespan{5s}, caf::connect_atom::value,
                std::string("127.0.0.1"), static_cast<uint16_t>(port))
      .receive([&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>&) { manager = std::move(ptr); },
               [&](caf::error& e) { out = "error: " + sys.render(e); });
  if (!manager) return out.empty() ? "error: nothing published" : out;
  using hello_atom = caf::atom_constant<caf::atom("hf_hello")>;
  self->request(caf::actor_cast<caf::actor>(manager), caf::timespan{5s}, hello_atom::value, kNodeProtocolVersion,
                caf::actor_cast<caf::actor>(self))
      .receive([&](std::string& j) { out = j; }, [&](caf::error& e) { out = "error: " + sys.render(e); });
  return out;
}

/// A networked Runtime carrying the controller's TLS files.
std::unique_ptr<Runtime> tls_runtime(const test::TlsFiles& f) {
  return std::make_unique<Runtime>(with_tls({.network = true}, f));
}

ClusterOptions tls_cluster(std::vector<std::string> nodes, const test::TlsFiles& f) {
  ClusterOptions o;
  o.nodes = std::move(nodes);
  o.connect_timeout = 3000ms;
  o.tls = f;
  return o;
}

}  // namespace

TEST_CASE("caf-node refuses a partial or bad TLS file set at start-up, naming the flag or file") {
  test::TlsCertificates certs;
  const auto node = certs.files("node");
  auto partial = run_node("--tls-cert=" + node.cert + " --tls-ca=" + node.ca);
  CHECK(partial.status == 2);
  CHECK_THAT(partial.output, Contains("--tls-key missing"));
  auto missing = run_node("--tls-cert=" + certs.path("nope.pem") + " --tls-key=" + node.key + " --tls-ca=" + node.ca);
  CHECK(missing.status == 2);
  CHECK_THAT(missing.output, Contains("nope.pem") && Contains("cannot be read"));
  auto not_pem = run_node("--tls-cert=" + node.cert + " --tls-key=" + node.key + " --tls-ca=" + node.key);
  CHECK(not_pem.status == 2);
  CHECK_THAT(not_pem.output, Contains("TLS CA file") && Contains("no PEM certificate"));
  auto wrong_key =
      run_node("--tls-cert=" + node.cert + " --tls-key=" + certs.path("rogue.key") + " --tls-ca=" + node.ca);
  CHECK(wrong_key.status == 2);
  CHECK_THAT(wrong_key.output, Contains("does not belong to the certificate"));
  // The same checks guard the controller side, naming the config keys.
  CHECK_THROWS_WITH(
      check_tls_files({node.cert, "", node.ca}, {"cluster.tls_cert", "cluster.tls_key", "cluster.tls_ca"}),
      Contains("cluster.tls_key missing"));
  CHECK_FALSE(check_tls_files({}));
  CHECK(check_tls_files(node));
  // and the controller's Runtime options, before CAF sees the files
  CHECK_THROWS_WITH(with_tls({.network = true}, {node.cert, "", node.ca}), Contains("tls_key missing"));
  CHECK_THROWS_WITH(with_tls({}, node), Contains("network"));
}

TEST_CASE("a TLS node serves a controller whose certificate its CA signed and refuses others within the bound") {
  test::TlsCertificates certs;
  test::NodeProcess node(certs.node_flags());
  {
    // A certificate from the node's CA: the front door, the TLS handshake and the hello go through.
    const auto controller = certs.files("controller");
    auto rt = tls_runtime(controller);
    auto cluster = RemoteLauncher::connect(*rt, tls_cluster({node.address()}, controller));
    CHECK(cluster->nodes().size() == 1);
    CHECK(cluster->nodes()[0].cpus >= 1);
    cluster.reset();
    rt.reset();
  }
  {
    // A certificate signed by another CA (the client trusts the node's CA): refused.
    const auto rogue = certs.files("rogue");
    auto rt = tls_runtime(rogue);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(RemoteLauncher::connect(*rt, tls_cluster({node.address()}, rogue)),
                      Contains("cannot connect to node " + node.address()));
    CHECK(std::chrono::steady_clock::now() - t0 < 8s);
    rt.reset();
  }
  // A plain (non-TLS) controller: a clear ClusterError naming the node, within the bound.
  RuntimeOptions ro;
  ro.network = true;
  auto rt = std::make_unique<Runtime>(ro);
  const auto t1 = std::chrono::steady_clock::now();
  try {
    RemoteLauncher::connect(*rt, {.nodes = {node.address()}, .connect_timeout = 3000ms});
    FAIL("expected a ClusterError");
  } catch (const ClusterError& e) {
    CHECK_THAT(std::string(e.what()), Contains("cannot connect to node " + node.address()) && Contains("TLS"));
  }
  CHECK(std::chrono::steady_clock::now() - t1 < 6s);
  rt.reset();
}

TEST_CASE("a certificate signed by the node's CA without the secret reaches nothing of CAF on a TLS node") {
  test::TlsCertificates certs;
  const std::string secret_file = certs.path("secret");
  std::ofstream(secret_file) << "tls and a secret\n";
  auto flags = certs.node_flags();
  flags.push_back("--secret-file=" + secret_file);
  test::NodeProcess node(flags);
  // CAF's own TLS client with a good certificate: the node speaks its front door first, so no
  // CAF session (remote spawn, SpawnServ, ConfigServ, the node manager) comes about.
  const std::string probe = tls_hello(certs.files("controller"), node.port());
  CHECK_THAT(probe, Contains("error"));
  // A hyflow controller with the certificate but without the secret is refused at the door.
  const auto controller = certs.files("controller");
  auto rt = tls_runtime(controller);
  CHECK_THROWS_WITH(RemoteLauncher::connect(*rt, tls_cluster({node.address()}, controller)),
                    Contains("requires a shared secret"));
  rt.reset();
}

TEST_CASE("a group of 4 workers runs DP_COMPUTE_PROTO over 2 mutual-TLS nodes with the shared secret") {
  test::register_test_workers();
  test::TlsCertificates certs;
  const std::string secret_file = certs.path("secret");
  std::ofstream(secret_file) << "tls and a secret\n";
  auto flags = certs.node_flags();
  flags.push_back("--secret-file=" + secret_file);
  test::NodeProcess a(flags), b(flags);
  const auto controller = certs.files("controller");
  auto rt = tls_runtime(controller);
  auto options = tls_cluster({a.address(), b.address()}, controller);
  options.secret = read_secret_file(secret_file);
  {
    auto cluster = RemoteLauncher::connect(*rt, options);
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(2), WorkerSpec{"EchoWorker", Json::object()});
    DataProto batch = test::make_batch(8);
    DataProto out = wg.call(&test::EchoWorker::double_x, batch);  // DP_COMPUTE_PROTO
    CHECK(torch::equal(out.batch.at("x"), batch.batch.at("x") * 2));
    CHECK(torch::equal(out.batch.at("rank"), torch::tensor({0, 0, 1, 1, 2, 2, 3, 3}, torch::kInt64)));
    // Over TLS the secret is still checked.
    auto wrong = tls_cluster({a.address()}, controller);
    wrong.secret = "not the secret";
    CHECK_THROWS_WITH(RemoteLauncher::connect(*rt, wrong), Contains("authentication failed"));
  }
  // CAF takes the files from the Runtime: cluster options naming others are refused, not
  // silently ignored. (A certificate from another CA is refused by the node: see above.)
  auto other = tls_cluster({a.address()}, certs.files("rogue"));
  CHECK_THROWS_WITH(RemoteLauncher::connect(*rt, other), Contains("differ from the Runtime's"));
  rt.reset();
}
