// The rollout seam: a toy backend registered with one line serves ActorRolloutRefWorker's
// generate_sequences / load_weights through actor_rollout_ref.rollout.name; unknown names fail
// at config time naming the key; the built-in "hf" backend frees and rebuilds its cache.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/rollout/all.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

#include <atomic>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using namespace workers_test;

namespace {

/// Answers every prompt with the same tokens (kCanned, then EOS), whatever the model says.
class CannedRollout final : public rollout::RolloutBackend {
 public:
  static inline const std::vector<int64_t> kCanned = {5, 6, 7};
  static inline std::atomic<int> generated{0}, loaded{0}, changed{0}, freed{0};

  explicit CannedRollout(const rollout::RolloutContext& context) : context_(context) {}

  DataProto generate_sequences(const DataProto& prompts, const inference::GenerationOptions& options) override {
    ++generated;
    const at::Tensor ids = prompts.batch.at("input_ids").repeat_interleave(options.n, 0);
    const at::Tensor mask = prompts.batch.at("attention_mask").repeat_interleave(options.n, 0);
    const int64_t rows = ids.size(0), R = options.max_new_tokens;
    at::Tensor responses = torch::full({rows, R}, kPad, torch::kLong);
    at::Tensor response_mask = torch::zeros({rows, R}, torch::kLong);
    std::vector<int64_t> tokens = kCanned;
    tokens.push_back(kEos);
    for (int64_t t = 0; t < std::min<int64_t>(R, static_cast<int64_t>(tokens.size())); ++t) {
      responses.select(1, t).fill_(tokens[static_cast<size_t>(t)]);
      response_mask.select(1, t).fill_(1);
    }
    const at::Tensor prompt_pos = (mask.cumsum(-1) - 1).clamp_min(0);
    const at::Tensor response_pos =
        prompt_pos.select(1, -1).unsqueeze(1) + torch::arange(1, R + 1, torch::kLong).unsqueeze(0);
    DataProto out(TensorDict{{"prompts", ids},
                             {"responses", responses},
                             {"input_ids", torch::cat({ids, responses}, 1)},
                             {"attention_mask", torch::cat({mask, response_mask}, 1)},
                             {"position_ids", torch::cat({prompt_pos, response_pos}, 1)},
                             {"response_mask", response_mask}});
    out.meta_info = prompts.meta_info;
    return out;
  }
  void load_weights(const models::NamedTensors& weights, const std::string&) override {
    CHECK_FALSE(weights.empty());
    ++loaded;
  }
  void weights_changed() override { ++changed; }
  void free_cache_engine() override { ++freed; }
  nlohmann::json stats() const override { return {{"engine", false}, {"canned", true}, {"rank", context_.rank}}; }

 private:
  rollout::RolloutContext context_;
};

// The one registration line a backend needs.
const bool registered =
    (rollout::register_rollout_backend(
         "canned", [](const rollout::RolloutContext& c) { return std::make_unique<CannedRollout>(c); }),
     true);

Json with_rollout_name(const std::string& name) {
  Json config = actor_rollout_ref_config();
  config["rollout"]["name"] = name;
  return config;
}

WorkerGroup group(Runtime& rt, int ws, const std::string& role, const Json& config) {
  workers::register_workers();
  WorkerGroup wg(rt, ResourcePool({ws}), WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", role}}});
  wg.call(&ActorRolloutRefWorker::init_model);
  return wg;
}

}  // namespace

TEST_CASE("a backend registered with one line serves generate_sequences for rollout.name = canned") {
  REQUIRE(registered);
  REQUIRE(rollout::has_rollout_backend("canned"));
  Runtime rt;
  WorkerGroup wg = group(rt, 2, "actor_rollout", with_rollout_name("canned"));
  const int before = CannedRollout::generated.load();
  DataProto out = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  CHECK(CannedRollout::generated.load() == before + 2);  // one call per rank
  REQUIRE(out.size() == 4);
  const at::Tensor expected_row = torch::tensor(std::vector<int64_t>{5, 6, 7, kEos, kPad, kPad}, torch::kLong);
  for (int64_t r = 0; r < 4; ++r) CHECK(torch::equal(out.batch.at("responses")[r], expected_row));
  CHECK(out.batch.at("response_mask").sum().item<int64_t>() == 4 * 4);
  // the worker scores the canned tokens with the policy (calculate_log_probs): finite on the
  // four produced tokens, 0 on padding
  const at::Tensor lp = out.batch.at("rollout_log_probs");
  CHECK(torch::isfinite(lp).all().item<bool>());
  CHECK(lp.narrow(1, 4, 2).abs().sum().item<double>() == 0.0);
  CHECK(lp.narrow(1, 0, 4).lt(0).all().item<bool>());
  const std::vector<Json> stats = wg.call(&ActorRolloutRefWorker::decode_stats);
  REQUIRE(stats.size() == 2);
  CHECK(stats[1].at("canned") == true);
  CHECK(stats[1].at("rank") == 1);
}

TEST_CASE("load_weights of a rollout group reaches the backend; a checkpoint load tells it the weights changed") {
  Runtime rt;
  WorkerGroup actor = group(rt, 1, "actor_rollout_ref", actor_rollout_ref_config());
  WorkerGroup canned = group(rt, 1, "rollout", with_rollout_name("canned"));
  const Value parts = actor.call(&ActorRolloutRefWorker::export_weights);
  DataProto weights = parts.list().front().dataproto();
  weights.meta_info["weight_version"] = 3;
  const int loaded = CannedRollout::loaded.load();
  canned.call(&ActorRolloutRefWorker::load_weights, weights);
  CHECK(CannedRollout::loaded.load() == loaded + 1);
  CHECK(std::vector<int64_t>(canned.call(&ActorRolloutRefWorker::weight_version)) == std::vector<int64_t>{3});
  DataProto out = canned.call(&ActorRolloutRefWorker::generate_sequences, prompts(2));
  CHECK(out.batch.at("min_weight_version").eq(3).all().item<bool>());

  TempDir dir("rollout_backend_ckpt");
  actor.call(&ActorRolloutRefWorker::save_checkpoint, (dir.path / "actor").string(), int64_t{1});
  Json config = with_rollout_name("canned");
  WorkerGroup hybrid = group(rt, 1, "actor_rollout", config);
  const int changed = CannedRollout::changed.load();
  hybrid.call(&ActorRolloutRefWorker::load_checkpoint, (dir.path / "actor").string());
  CHECK(CannedRollout::changed.load() == changed + 1);
}

TEST_CASE("an unknown rollout.name fails when the config is read, naming the key and the registered backends") {
  try {
    (void)workers::parse_actor_rollout_ref_config(with_rollout_name("caned"));
    FAIL("no error");
  } catch (const KeyError& e) {
    const std::string what = e.what();
    CHECK(what.find("actor_rollout_ref.rollout.name") != std::string::npos);
    CHECK(what.find("'caned'") != std::string::npos);
    CHECK(what.find("did you mean 'canned'") != std::string::npos);
    CHECK(what.find("hf") != std::string::npos);
  }
  CHECK_THROWS_AS(rollout::make_rollout_backend("vllm", {}), KeyError);
}

TEST_CASE(
    "the built-in hf backend: free_cache_engine releases the KV pool (packed weights kept), the next rollout "
    "rebuilds it and gives the same greedy tokens") {
  models::CausalLM model(tiny_config());
  auto backend = rollout::make_rollout_backend("hf", {.model = model});
  inference::GenerationOptions options;
  options.max_new_tokens = 6;
  options.do_sample = false;
  options.sampling = cuda::SamplingOptions{.greedy = true};
  options.engine = inference::GenerationEngine::kDecode;
  const DataProto first = backend->generate_sequences(prompts(3), options);
  CHECK(backend->stats().at("engine") == true);
  const int64_t packed = backend->stats().at("packed_bytes").get<int64_t>();
  CHECK(packed > 0);
  const int64_t pool = backend->stats().at("kv_pool_bytes").get<int64_t>();
  CHECK(pool > 0);
  const Json stats = backend->stats();
  CHECK(pool == stats.at("kv_pool_blocks").get<int64_t>() * stats.at("kv_block_bytes").get<int64_t>());
  backend->free_cache_engine();
  CHECK(backend->stats().at("kv_pool_bytes").get<int64_t>() == 0);
  CHECK(backend->stats().at("packed_bytes").get<int64_t>() == packed);
  const DataProto again = backend->generate_sequences(prompts(3), options);
  CHECK(backend->stats().at("engine") == true);
  CHECK(backend->stats().at("kv_pool_bytes").get<int64_t>() == pool);
  CHECK(backend->stats().at("packed_weights").get<int64_t>() == 0);  // nothing repacked
  CHECK(torch::equal(first.batch.at("responses"), again.batch.at("responses")));
  CHECK(torch::equal(first.batch.at("attention_mask"), again.batch.at("attention_mask")));
}

TEST_CASE("the worker frees the rollout's KV pool after each rollout when rollout.free_cache_engine is true") {
  for (const bool free_cache : {true, false}) {
    DYNAMIC_SECTION("free_cache_engine = " << free_cache) {
      Runtime rt;
      Json config = actor_rollout_ref_config();
      config["rollout"]["free_cache_engine"] = free_cache;
      WorkerGroup canned_config = group(rt, 1, "actor_rollout", [&] {
        Json c = config;
        c["rollout"]["name"] = "canned";
        return c;
      }());
      const int freed = CannedRollout::freed.load();
      canned_config.call(&ActorRolloutRefWorker::generate_sequences, prompts(2));
      CHECK(CannedRollout::freed.load() == freed + (free_cache ? 1 : 0));

      WorkerGroup hf = group(rt, 1, "actor_rollout", config);
      DataProto greedy = prompts(3);
      greedy.meta_info["do_sample"] = false;
      const DataProto first = hf.call(&ActorRolloutRefWorker::generate_sequences, greedy);
      const Json stats = std::vector<Json>(hf.call(&ActorRolloutRefWorker::decode_stats)).front();
      CHECK(stats.at("engine") == true);
      CHECK(stats.at("kv_pool_blocks").get<int64_t>() > 0);  // the run had a pool
      if (free_cache)
        CHECK(stats.at("kv_pool_bytes").get<int64_t>() == 0);
      else
        CHECK(stats.at("kv_pool_bytes").get<int64_t>() > 0);
      const DataProto again = hf.call(&ActorRolloutRefWorker::generate_sequences, greedy);  // the pool remade
      CHECK(torch::equal(first.batch.at("responses"), again.batch.at("responses")));
    }
  }
}

TEST_CASE("a backend without a server refuses black-box agents, naming the backend that serves them") {
  Runtime rt;
  WorkerGroup wg = group(rt, 1, "actor_rollout", with_rollout_name("canned"));
  CHECK_THROWS_WITH(wg.call(&ActorRolloutRefWorker::open_agent_server),
                    Catch::Contains("serves no outside agents") && Catch::Contains("rollout.name=server"));
  CHECK_THROWS_WITH(wg.call(&ActorRolloutRefWorker::collect_agent_sessions, std::vector<std::string>{"a"}),
                    Catch::Contains("records no agent sessions"));
}
