// Single-process pieces of the cluster layer: what a node advertises, TLS file checks, what an
// embedding application's actor system needs before connect.
#include "tls_files.hpp"

#include <hyflow/cluster/all.hpp>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <fstream>

using namespace hyflow;
using namespace hyflow::cluster;
using Catch::Matchers::Contains;

TEST_CASE("NodeInfo with GPU names and memory survives a JSON round trip") {
  NodeInfo n;
  n.address = "10.0.0.2:7000";
  n.hostname = "gpu-box";
  n.cpus = 16;
  n.gpus = 2;
  n.gpu_names = {"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"};
  n.gpu_memory_bytes = {85029158912LL, 85029158912LL};  // above 2^32: must stay 64-bit
  n.protocol_version = kNodeProtocolVersion;
  const Json j = n.to_json();
  CHECK(j.at("gpu_memory_bytes")[1].get<int64_t>() == 85029158912LL);
  const NodeInfo back = NodeInfo::from_json(Json::parse(j.dump()));
  CHECK(back.address == n.address);
  CHECK(back.hostname == n.hostname);
  CHECK(back.cpus == 16);
  CHECK(back.gpus == 2);
  CHECK(back.gpu_names == n.gpu_names);
  CHECK(back.gpu_memory_bytes == n.gpu_memory_bytes);
  CHECK(back.protocol_version == kNodeProtocolVersion);
  // A node without GPUs (or an older node) sends none: empty lists, not an error.
  const NodeInfo cpu = NodeInfo::from_json(Json{{"address", "a:1"}, {"cpus", 2}});
  CHECK(cpu.gpus == 0);
  CHECK(cpu.gpu_names.empty());
  CHECK(cpu.gpu_memory_bytes.empty());
}

TEST_CASE("TLS files: all three or none, readable PEM of the right kind, key matching the certificate") {
  test::TlsCertificates certs;
  const auto f = certs.files("node");
  const std::vector<std::string> names{"cluster.tls_cert", "cluster.tls_key", "cluster.tls_ca"};
  CHECK_FALSE(check_tls_files({"", "", ""}, names));
  CHECK(check_tls_files({f.cert, f.key, f.ca}, names));
  CHECK_THROWS_WITH(check_tls_files({f.cert, "", ""}, names),
                    Contains("cluster.tls_cert given") && Contains("cluster.tls_key, cluster.tls_ca missing"));
  CHECK_THROWS_AS(check_tls_files({"", f.key, f.ca}, names), ValueError);
  CHECK_THROWS_WITH(check_tls_files({certs.path("absent.pem"), f.key, f.ca}, names),
                    Contains("absent.pem") && Contains("cannot be read"));
  CHECK_THROWS_WITH(check_tls_files({f.key, f.key, f.ca}, names), Contains("no PEM certificate"));
  CHECK_THROWS_WITH(check_tls_files({f.cert, f.cert, f.ca}, names), Contains("no unencrypted PEM private key"));
  CHECK_THROWS_WITH(check_tls_files({f.cert, certs.path("rogue.key"), f.ca}, names),
                    Contains("does not belong to the certificate"));
  const std::string empty = certs.path("empty.pem");
  std::ofstream(empty) << "";
  CHECK_THROWS_WITH(check_tls_files({f.cert, f.key, empty}, names), Contains("TLS CA file") && Contains("empty.pem"));
}

TEST_CASE("node lists: host:port entries, trimmed; a bad port names the entry") {
  CHECK(parse_node_list(" a:1, b:2 ") == std::vector<std::string>{"a:1", "b:2"});
  CHECK_THROWS_WITH(parse_node_list("a:1,b:x"), Contains("'b:x'"));
  CHECK_THROWS_WITH(parse_node_list("a:70000"), Contains("port out of range"));
  CHECK_THROWS_AS(parse_node_list(" , "), ValueError);
}

namespace {
struct PlainAppConfig : caf::actor_system_config {
  PlainAppConfig() { Runtime::register_types(*this); }
};
struct NetworkedAppConfig : caf::actor_system_config {
  NetworkedAppConfig() {
    Runtime::register_types(*this);
    Runtime::configure_network(*this);
  }
};
}  // namespace

TEST_CASE("connect on Runtime(system) without a middleman says what the application's config needs") {
  PlainAppConfig cfg;
  caf::actor_system system{cfg};
  Runtime runtime(system);
  CHECK_THROWS_AS(RemoteLauncher::connect(runtime, {.nodes = {"127.0.0.1:1"}}), ValueError);
  CHECK_THROWS_WITH(RemoteLauncher::connect(runtime, {.nodes = {"127.0.0.1:1"}}),
                    Contains("Runtime(system) has no middleman") && Contains("Runtime::configure_network(*this)") &&
                        Contains("load<caf::io::middleman>()") &&
                        Contains("\"scheduler.policy\", caf::atom(\"sharing\")") &&
                        Contains("\"middleman.heartbeat-interval\", caf::timespan{") &&
                        Contains("\"middleman.connection-timeout\", caf::timespan{") && !Contains("RuntimeOptions"));
}

TEST_CASE("Runtime::configure_network gives the application's system what connect needs") {
  NetworkedAppConfig cfg;
  CHECK(caf::get_or(cfg, "scheduler.policy", caf::atom("")) == caf::atom("sharing"));
  CHECK(caf::get_or(cfg, "middleman.heartbeat-interval", caf::timespan{0}) ==
        caf::timespan{std::chrono::milliseconds(500)});
  CHECK(caf::get_or(cfg, "middleman.connection-timeout", caf::timespan{0}) == caf::timespan{std::chrono::seconds(3)});
  caf::actor_system system{cfg};
  CHECK(system.has_middleman());
  Runtime runtime(system);
  // Past the middleman check: a port nothing listens on is the network's answer, naming the node.
  CHECK_THROWS_WITH(
      RemoteLauncher::connect(runtime, {.nodes = {"127.0.0.1:1"}, .connect_timeout = std::chrono::seconds(2)}),
      Contains("127.0.0.1:1"));
}

TEST_CASE("RemoteLauncher::connect on a Runtime without networking names RuntimeOptions{.network = true}") {
  Runtime runtime;
  CHECK_THROWS_WITH(RemoteLauncher::connect(runtime, {.nodes = {"127.0.0.1:1"}}),
                    Contains("RuntimeOptions{.network = true}"));
}
