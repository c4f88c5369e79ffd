// The "server" rollout backend: every rank of the rollout group serves its model over HTTP and
// generate_sequences goes through that server, yet the batch is the "hf" backend's, column for
// column (greedy tokens equal token for token, sampled ones repeat for a seed); weight loads go
// through the server's drain and bump its version; the servers answer outside clients (503 while
// the trainer holds the weights, between the backend's calls), and
// the config keys of actor_rollout_ref.rollout.server are checked by name.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/rollout/all.hpp>
#include <hyflow/workers/all.hpp>

#include <httplib.h>
#include <catch2/catch.hpp>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using namespace workers_test;

namespace {

Json config_for(const std::string& backend) {
  Json config = actor_rollout_ref_config();
  config["rollout"]["name"] = backend;
  if (backend == "server") config["rollout"]["server"] = {{"tokenizer_path", tiny_model_dir().string()}};
  return config;
}

WorkerGroup group(Runtime& rt, int ws, const std::string& role, const Json& config) {
  workers::register_workers();
  WorkerGroup wg(rt, ResourcePool({ws}), WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", role}}});
  wg.call(&ActorRolloutRefWorker::init_model);
  return wg;
}

DataProto tagged_prompts(int64_t rows, bool greedy) {
  DataProto p = prompts(rows);
  dataproto::Column uid;
  for (int64_t r = 0; r < rows; ++r) uid.push_back("uid-" + std::to_string(r));
  p.non_tensor_batch["uid"] = uid;
  p.meta_info["validate"] = greedy;
  p.meta_info["response_length"] = 6;
  p.meta_info["note"] = "kept";
  return p;
}

void check_same_batch(const DataProto& a, const DataProto& b, bool compare_log_probs) {
  REQUIRE(a.batch.keys() == b.batch.keys());
  for (const auto& key : a.batch.keys()) {
    INFO(key);
    if (key == "rollout_log_probs" && !compare_log_probs) continue;
    CHECK(a.batch.at(key).sizes() == b.batch.at(key).sizes());
    CHECK(a.batch.at(key).dtype() == b.batch.at(key).dtype());
    CHECK(torch::equal(a.batch.at(key), b.batch.at(key)));
  }
  CHECK(a.non_tensor_batch.at("uid") == b.non_tensor_batch.at("uid"));
  Json am = a.meta_info, bm = b.meta_info;
  for (auto* m : {&am, &bm}) m->erase("timing");  // wall-clock
  CHECK(am == bm);
}

}  // namespace

TEST_CASE("rollout.name=server: greedy rollouts equal hf's token for token, on 2 ranks, columns and all") {
  Runtime rt;
  WorkerGroup hf = group(rt, 2, "actor_rollout", config_for("hf"));
  WorkerGroup server = group(rt, 2, "actor_rollout", config_for("server"));
  for (int call = 0; call < 2; ++call) {  // the second call after free_cache_engine released the pools
    const DataProto p = tagged_prompts(8, /*greedy=*/true);
    DataProto want = hf.call(&ActorRolloutRefWorker::generate_sequences, p);
    DataProto got = server.call(&ActorRolloutRefWorker::generate_sequences, p);
    REQUIRE(got.size() == 8);
    CHECK(got.batch.at("response_mask").sum().item<int64_t>() > 8);
    check_same_batch(want, got, /*compare_log_probs=*/true);
  }
  const std::vector<Json> stats = server.call(&ActorRolloutRefWorker::decode_stats);
  REQUIRE(stats.size() == 2);
  CHECK(stats[0].at("base_url") != stats[1].at("base_url"));
  for (const auto& s : stats) {
    CHECK(s.at("rollout_rows") == 8);  // 4 rows per rank, two calls
    CHECK(s.at("rollout_calls") == 2);
    // the rank's server answers anyone on loopback; between the backend's calls the engine is
    // held (the trainer owns the weights): completions and /health are 503 with Retry-After
    const std::string url = s.at("base_url");
    httplib::Client c(url.substr(0, url.size() - 3));
    auto res = c.Get("/health");
    REQUIRE(res);
    CHECK(res->status == 503);
    CHECK(res->has_header("Retry-After"));
    auto held = c.Post("/v1/completions", R"({"prompt": [3, 4], "max_tokens": 2})", "application/json");
    REQUIRE(held);
    CHECK(held->status == 503);
    auto models = c.Get("/v1/models");
    REQUIRE(models);
    CHECK(Json::parse(models->body)["data"][0]["id"] == "hyflow");
  }
}

TEST_CASE("rollout.name=server: sampled rollouts repeat for the same seed and keep hf's layout") {
  Runtime rt;
  WorkerGroup a = group(rt, 1, "actor_rollout", config_for("server"));
  WorkerGroup b = group(rt, 1, "actor_rollout", config_for("server"));
  WorkerGroup hf = group(rt, 1, "actor_rollout", config_for("hf"));
  const DataProto p = tagged_prompts(6, /*greedy=*/false);
  DataProto x = a.call(&ActorRolloutRefWorker::generate_sequences, p);
  DataProto y = b.call(&ActorRolloutRefWorker::generate_sequences, p);
  check_same_batch(x, y, true);
  // sampled tokens are keyed differently from hf's (seed, sample, step vs seed, row, step): the
  // layout matches, the tokens need not
  DataProto h = hf.call(&ActorRolloutRefWorker::generate_sequences, p);
  CHECK(h.batch.keys() == x.batch.keys());
  CHECK(torch::equal(h.batch.at("prompts"), x.batch.at("prompts")));
  CHECK(h.batch.at("responses").sizes() == x.batch.at("responses").sizes());
  // a prompt repeated n times (the trainer's GRPO groups, interleaved) is one request of n
  // samples: distinct draws, not n copies of one
  const DataProto grouped = tagged_prompts(2, false).repeat(4, /*interleave=*/true);
  DataProto g = a.call(&ActorRolloutRefWorker::generate_sequences, grouped);
  for (int64_t group = 0; group < 2; ++group) {
    const at::Tensor r = g.batch.at("responses").narrow(0, group * 4, 4);
    CHECK(std::get<0>(torch::unique_dim(r, 0)).size(0) > 1);
  }
  // the rollout_log_probs are the actor's scores of the tokens, 0 on padding
  CHECK(x.batch.at("rollout_log_probs").masked_select(x.batch.at("response_mask").eq(0)).abs().sum().item<double>() ==
        0.0);
}

TEST_CASE("rollout.name=server: load_weights goes through the server's drain and moves its version") {
  Runtime rt;
  WorkerGroup actor = group(rt, 1, "actor_rollout_ref", config_for("hf"));
  WorkerGroup server = group(rt, 1, "rollout", config_for("server"));
  WorkerGroup hf = group(rt, 1, "rollout", config_for("hf"));
  // new weights: the actor's, moved a little
  const Value parts = actor.call(&ActorRolloutRefWorker::export_weights);
  DataProto weights = parts.list().front().dataproto();
  for (const auto& key : weights.batch.keys()) weights.batch.set(key, weights.batch.at(key) * 1.05);
  weights.meta_info["weight_version"] = 1;
  const Json before = std::vector<Json>(server.call(&ActorRolloutRefWorker::decode_stats)).front();
  server.call(&ActorRolloutRefWorker::load_weights, weights);
  hf.call(&ActorRolloutRefWorker::load_weights, weights);
  const Json after = std::vector<Json>(server.call(&ActorRolloutRefWorker::decode_stats)).front();
  CHECK(after.at("weight_version").get<int64_t>() > before.at("weight_version").get<int64_t>());
  const DataProto p = tagged_prompts(8, true);
  DataProto want = hf.call(&ActorRolloutRefWorker::generate_sequences, p);
  DataProto got = server.call(&ActorRolloutRefWorker::generate_sequences, p);
  check_same_batch(want, got, true);
}

TEST_CASE("rollout.name=server: its keys are checked by name at config time") {
  Json config = config_for("server");
  config["rollout"]["server"]["max_in_flght"] = 4;
  CHECK_THROWS_WITH(
      workers::parse_actor_rollout_ref_config(config),
      Catch::Contains("actor_rollout_ref.rollout.server.max_in_flght") && Catch::Contains("max_in_flight"));
  config["rollout"]["server"].erase("max_in_flght");
  config["rollout"]["server"]["port"] = 70000;
  CHECK_THROWS_WITH(workers::parse_actor_rollout_ref_config(config), Catch::Contains("server.port"));
  // a non-loopback bind without a token is refused when the backend starts
  Json open = config_for("server");
  open["rollout"]["server"]["host"] = "0.0.0.0";
  CHECK_THROWS_WITH(rollout::make_rollout_backend(
                        "server", {.model = models::load_causal_lm(tiny_model_dir()), .config = open["rollout"]}),
                    Catch::Contains("bearer token"));
  Json no_tokenizer = config_for("server");
  no_tokenizer["rollout"].erase("server");
  CHECK_THROWS_WITH(rollout::make_rollout_backend("server", {.model = models::load_causal_lm(tiny_model_dir()),
                                                             .config = no_tokenizer["rollout"]}),
                    Catch::Contains("actor_rollout_ref.rollout.server.tokenizer_path"));
}
