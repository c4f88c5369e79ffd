// The trainer through the rollout server (actor_rollout_ref.rollout.name=server): on 2 colocated
// workers each rank serves its policy over HTTP, the trainer starts a router in front of them and
// writes its URL to rollout_server.json, and the run gives the direct path's greedy validation
// values exactly (GRPO; and with greedy training rollouts, REINFORCE++'s every metric step for step).
#include "ppo_test_fixture.hpp"

#include <hyflow/trainer/ppo_trainer.hpp>

#include <httplib.h>
#include <catch2/catch.hpp>

#include <fstream>

using namespace hyflow;
using namespace hyflow::trainer;
using namespace ppo_test;

namespace {

std::vector<nlohmann::json> run(const std::string& estimator, const fs::path& out, const std::string& backend,
                                const std::vector<std::string>& extra = {}) {
  Config c = small_config(estimator, out);
  std::vector<std::string> args{"--actor_rollout_ref.rollout.name=" + backend, "--trainer.val_before_train=true"};
  args.insert(args.end(), extra.begin(), extra.end());
  c.apply_arguments(args);
  PPOTrainer t(c);
  t.init_workers();
  if (backend == "server") {
    // the router is up while the trainer lives, in front of both ranks' servers
    std::ifstream in(out / "rollout_server.json");
    REQUIRE(in);
    const auto record = nlohmann::json::parse(in);
    REQUIRE(record.at("replicas").size() == 2);
    const std::string url = record.at("base_url");
    httplib::Client router(url.substr(0, url.size() - 3));
    auto models = router.Get("/v1/models");
    REQUIRE(models);
    CHECK(models->status == 200);
    // between rollouts the servers hold their engines (the trainer owns the weights): 503 on both
    auto health = router.Get("/health");
    REQUIRE(health);
    CHECK(health->status == 503);
    CHECK(nlohmann::json::parse(health->body)["replicas"].size() == 2);
  }
  t.fit();
  return t.history();
}

// The metrics that do not measure time or throughput.
nlohmann::json values(const nlohmann::json& m) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : m.items()) {
    const bool clock = k.rfind("timing", 0) == 0 || k.rfind("perf/", 0) == 0 || k.find("_s/") != std::string::npos ||
                       k.find("time") != std::string::npos || k.find("throughput") != std::string::npos;
    if (!clock) out[k] = v;
  }
  return out;
}

nlohmann::json validation(const nlohmann::json& m) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : m.items())
    if (k.rfind("val-", 0) == 0) out[k] = v;
  return out;
}

}  // namespace

TEST_CASE("GRPO through rollout.name=server: the direct path's greedy validation values, exactly") {
  TempDir a("grpo_hf"), b("grpo_server");
  const auto direct = run("grpo", a.path, "hf");
  const auto served = run("grpo", b.path, "server");
  REQUIRE(direct.size() == 4);
  REQUIRE(served.size() == 4);
  const auto before = validation(direct.front());
  REQUIRE(before.contains("val-core/arithmetic/reward/mean@1"));
  CHECK(validation(served.front()) == before);  // same weights, greedy: the same responses and scores
  for (const auto& m : served)
    CHECK(m.contains(m.at("step") == 0 ? "val-core/arithmetic/reward/mean@1" : "actor/pg_loss"));
}

TEST_CASE("REINFORCE++ with greedy training rollouts through the server: every metric equals the direct path's") {
  // greedy rollouts are equal both ways, so the updates are too: every step's metrics (clocks aside)
  TempDir a("rpp_hf"), b("rpp_server");
  const std::vector<std::string> greedy{"--actor_rollout_ref.rollout.do_sample=false"};
  const auto direct = run("reinforce_plus_plus", a.path, "hf", greedy);
  const auto served = run("reinforce_plus_plus", b.path, "server", greedy);
  REQUIRE(direct.size() == 4);
  REQUIRE(served.size() == direct.size());
  bool learned = false;  // the policy moved: the comparison is not of three idle steps
  for (size_t i = 0; i < direct.size(); ++i) {
    INFO("history entry " << i);
    CHECK(values(served[i]) == values(direct[i]));
    if (direct[i].contains("actor/grad_norm") && direct[i].at("actor/grad_norm").get<double>() > 0) learned = true;
  }
  CHECK(learned);
  CHECK(direct.back().contains("val-core/arithmetic/reward/mean@1"));
}
