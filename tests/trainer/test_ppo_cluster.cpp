// The PPO trainer with its workers on caf-node processes (cluster.nodes): the same 2-step GRPO
// run placed on 2 nodes of 1 worker each gives the metrics of the in-process run with 2
// workers (also in separate_async mode, the rollout group on a node of its own ranks), a node
// that is not listening is an error naming it, and the step timeline shows each remote worker's
// calls as the controller observed them.
#include "node_process.hpp"
#include "ppo_test_fixture.hpp"
#include "trace_validator.hpp"

#include <hyflow/cluster/all.hpp>
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <catch2/catch.hpp>

#include <fstream>

using namespace hyflow;
using namespace hyflow::cluster;
using namespace hyflow::trainer;
using namespace ppo_test;

namespace {
nlohmann::json without_timings(const nlohmann::json& m) {
  nlohmann::json out;
  for (const auto& [k, v] : m.items())
    if (k.rfind("timing", 0) != 0 && k.rfind("perf/", 0) != 0) out[k] = v;
  return out;
}

std::vector<nlohmann::json> run(Config c) {
  c.set("trainer.total_training_steps", "2");
  c.set("trainer.test_freq", "2");
  PPOTrainer t(c);
  t.init_workers();
  t.fit();
  std::vector<nlohmann::json> out;
  for (const auto& m : t.history()) out.push_back(without_timings(m));
  return out;
}
}  // namespace

TEST_CASE("GRPO with workers on 2 caf-nodes gives the metrics of the in-process run") {
  TempDir local_out("local"), cluster_out("cluster");
  const auto local = run(small_config("grpo", local_out.path));

  test::NodeProcess a, b;
  Config c = small_config("grpo", cluster_out.path);
  c.set("trainer.nnodes", "2");
  c.set("trainer.n_gpus_per_node", "1");
  c.set("cluster.nodes", b.address() + "," + a.address());  // listing order does not matter
  const auto remote = run(c);

  REQUIRE(remote.size() == local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    for (const auto& [k, v] : local[i].items()) {
      CAPTURE(i, k);
      REQUIRE(remote[i].contains(k));
      if (v.is_number())
        CHECK(remote[i].at(k).get<double>() == Approx(v.get<double>()).margin(1e-9));
      else
        CHECK(remote[i].at(k) == v);
    }
  }
  CHECK(remote.back().contains("val-core/arithmetic/reward/mean@1"));
}

TEST_CASE("separate_async with its groups on 2 caf-nodes (weights through the data plane) gives the metrics of the "
          "in-process run") {
  auto async = [](Config c) {
    c.set("trainer.v1.trainer_mode", "separate_async");
    c.set("actor_rollout_ref.rollout.n_gpus_per_node", "1");
    return c;
  };
  TempDir local_out("async_local"), cluster_out("async_cluster");
  const auto local = run(async(small_config("grpo", local_out.path)));

  test::NodeProcess a, b;
  Config c = async(small_config("grpo", cluster_out.path));
  c.set("trainer.nnodes", "2");
  c.set("trainer.n_gpus_per_node", "1");
  c.set("cluster.nodes", a.address() + "," + b.address());
  const auto remote = run(c);

  REQUIRE(remote.size() == local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    CHECK(remote[i].contains("training/off_policy/trajectory_staleness/max") ==
          local[i].contains("training/off_policy/trajectory_staleness/max"));
    for (const auto& [k, v] : local[i].items()) {
      CAPTURE(i, k);
      REQUIRE(remote[i].contains(k));
      if (v.is_number())
        CHECK(remote[i].at(k).get<double>() == Approx(v.get<double>()).margin(1e-9));
      else
        CHECK(remote[i].at(k) == v);
    }
  }
}

TEST_CASE("trainer.profile_steps on 2 caf-nodes: each remote worker's calls as observed, inside the controller's") {
  using namespace trace_test;
  TempDir out("timeline_cluster");
  test::NodeProcess a, b;
  Config c = small_config("grpo", out.path);
  c.set("trainer.nnodes", "2");
  c.set("trainer.n_gpus_per_node", "1");
  c.set("cluster.nodes", a.address() + "," + b.address());
  c.set("trainer.total_training_steps", "1");
  c.set("trainer.val_before_train", "false");
  c.set("trainer.test_freq", "-1");
  c.set("trainer.profile_steps", "[1]");
  PPOTrainer t(c);
  t.init_workers();
  t.fit();
  const Timeline tl = validate_format(read_json(out.path / "timeline" / "step_1.trace.json"));
  const auto& ctl = tl.tracks.at("controller");
  int remote_tracks = 0;
  for (const auto& [name, spans] : tl.tracks) {
    require_nested(name, spans);
    if (name.rfind("controller", 0) == 0) continue;
    ++remote_tracks;
    INFO(name);
    CHECK(spans.size() >= 4);  // generate, old and ref log-probs, update
    for (size_t i = 0; i < spans.size(); ++i) {
      INFO(spans[i].name);
      CHECK(spans[i].cat == "execute (observed)");                 // the caf-node process records nothing itself
      if (i > 0) CHECK(spans[i].ts >= spans[i - 1].end() - kEps);  // one call at a time
      CHECK(std::any_of(ctl.begin(), ctl.end(), [&](const Span& call) {
        return call.cat == "call" && call.contains(spans[i]) && ends_with(spans[i].name, call.name);
      }));
    }
  }
  CHECK(remote_tracks == 2);
}

TEST_CASE("cluster.nodes naming a closed port fails with the node's address") {
  TempDir out("closed");
  Config c = small_config("grpo", out.path);
  c.set("cluster.nodes", "127.0.0.1:1");
  c.set("trainer.n_gpus_per_node", "1");
  c.set("trainer.nnodes", "1");
  CHECK_THROWS_WITH(PPOTrainer(c), Catch::Contains("127.0.0.1:1"));
}

TEST_CASE("cluster.data_plane_bind/host configure this process's data server before connecting") {
  TempDir out("plane");
  Config c = small_config("grpo", out.path);
  c.set("cluster.nodes", "127.0.0.1:1");
  c.set("cluster.data_plane_bind", "127.0.0.1");
  c.set("cluster.data_plane_host", "127.0.0.1");
  CHECK_THROWS(PPOTrainer(c));  // nothing listens on port 1
  CHECK(DataPlane::process_options().bind == "127.0.0.1");
  CHECK(DataPlane::process_options().advertise == "127.0.0.1");
}

TEST_CASE("cluster.secret_file must exist") {
  TempDir out("secret");
  Config c = small_config("grpo", out.path);
  c.set("cluster.nodes", "127.0.0.1:1");
  c.set("cluster.secret_file", (out.path / "missing").string());
  CHECK_THROWS_WITH(PPOTrainer(c), Catch::Contains("cluster.secret_file") && Catch::Contains("missing"));
}

TEST_CASE("cluster.nodes that do not parse and a partial TLS set name their keys") {
  TempDir out("keys");
  Config c = small_config("grpo", out.path);
  c.set("cluster.nodes", "127.0.0.1");
  CHECK_THROWS_WITH(PPOTrainer(c), Catch::Contains("cluster.nodes"));
  c.set("cluster.nodes", "127.0.0.1:1");
  c.set("cluster.tls_cert", (out.path / "cert.pem").string());
  CHECK_THROWS_WITH(PPOTrainer(c), Catch::Contains("cluster.tls_key"));
}
