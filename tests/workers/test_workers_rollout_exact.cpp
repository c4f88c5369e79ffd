// The rollout's log-probs are the actor's (generate_sequences / continue_sequences score their
// tokens with compute_log_prob's code), and the rollout worker keeps one decode engine across
// calls: unchanged weights are not repacked, changed ones are, sharded policies drop the packed copy.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/inference/generation.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using namespace workers_test;

namespace {
WorkerGroup group(Runtime& rt, int ws, const std::string& role, const Json& config) {
  hyflow::workers::register_workers();
  WorkerGroup wg(rt, ResourcePool({ws}), WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", role}}});
  wg.call(&ActorRolloutRefWorker::init_model);
  return wg;
}

Json config_with(const Json& fsdp_config, const Json& rollout_overrides = Json::object()) {
  Json config = actor_rollout_ref_config(8);  // a mini-batch of 8 rows divides over 2 and 4 workers
  config["actor"]["fsdp_config"] = fsdp_config;
  config["rollout"].merge_patch(rollout_overrides);
  return config;
}

DataProto greedy(DataProto p, int64_t length) {
  p.meta_info["validate"] = true;
  p.meta_info["response_length"] = length;
  return p;
}

/// compute_log_prob's old_log_probs with padding zeroed, as rollout_log_probs has it.
at::Tensor actor_log_probs(WorkerGroup& actor, DataProto rollout, double temperature) {
  rollout.meta_info["temperature"] = temperature;
  DataProto out = actor.call(&ActorRolloutRefWorker::compute_log_prob, rollout);
  return out.batch.at("old_log_probs").masked_fill(rollout.batch.at("response_mask").eq(0), 0.0);
}

/// The rows of `data` in the order `perm` (balance_batch moves rows between workers like this).
DataProto permuted(const DataProto& data, const at::Tensor& perm) {
  TensorDict batch;
  for (const auto& [key, t] : data.batch) batch.set(key, t.index_select(0, perm));
  return DataProto(std::move(batch), {}, data.meta_info);
}

DataProto exported(WorkerGroup& actor, int64_t version) {
  const Value parts = actor.call(&ActorRolloutRefWorker::export_weights);
  DataProto weights = parts.list().front().dataproto();
  weights.meta_info["weight_version"] = version;
  return weights;
}

/// Greedy tokens of a fresh decode engine (inference::generate without a kept engine) on `weights`.
DataProto fresh_greedy(const DataProto& weights, const DataProto& p, int64_t length) {
  auto model = models::load_causal_lm(tiny_model_dir());
  models::NamedTensors tensors;
  for (const auto& [name, t] : weights.batch) tensors.emplace_back(name, t.select(0, 0));
  models::load_parameters(*model, tensors, "test weights");
  inference::GenerationOptions options;
  options.max_new_tokens = length;
  options.do_sample = false;
  options.sampling.greedy = true;
  options.engine = inference::GenerationEngine::kDecode;
  return inference::generate(model, p, options);
}

/// One PPO update on the group's own rollout.
void train_once(WorkerGroup& actor) {
  DataProto gen = actor.call(&ActorRolloutRefWorker::generate_sequences, prompts(8, 5, 11));
  gen.union_with(DataProto(actor.call(&ActorRolloutRefWorker::compute_log_prob, gen))
                     .select(std::vector<std::string>{"old_log_probs"}));
  actor.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen));
}

std::vector<Json> stats(WorkerGroup& wg) {
  return wg.call(&ActorRolloutRefWorker::decode_stats);
}

int64_t full_parameter_bytes() {
  int64_t bytes = 0;
  for (const auto& p : models::load_causal_lm(tiny_model_dir())->parameters()) bytes += p.numel() * 4;
  return bytes;
}

struct Layout {
  const char* name;
  int workers;
  Json fsdp_config;
  bool sharded;
};
const std::vector<Layout> kLayouts = {{"one worker", 1, Json::object(), false},
                                      {"2 workers replicated (fsdp_size 1)", 2, {{"fsdp_size", 1}}, false},
                                      {"2 workers FULL_SHARD", 2, {{"fsdp_size", -1}}, true},
                                      {"4 workers HYBRID_SHARD", 4, {{"fsdp_size", 2}}, true}};
}  // namespace

TEST_CASE(
    "rollout_log_probs equal compute_log_prob's old_log_probs bit for bit, whichever worker and micro-batch "
    "scores a row") {
  struct Batching {
    const char* name;
    Json rollout;
  };
  const std::vector<Batching> batchings = {
      {"micro-batches of 2", Json::object()},
      {"micro-batches of 3, the last one short", {{"log_prob_micro_batch_size_per_gpu", 3}}},
      {"one pass per worker", {{"log_prob_micro_batch_size_per_gpu", nullptr}}},
      {"dynamic micro-batches", {{"log_prob_use_dynamic_bsz", true}, {"log_prob_max_token_len_per_gpu", 25}}}};
  for (const auto& layout : kLayouts) {
    for (const auto& batching : batchings) {
      SECTION(std::string(layout.name) + ", " + batching.name) {
        Runtime rt;
        auto wg = group(rt, layout.workers, "actor_rollout_ref", config_with(layout.fsdp_config, batching.rollout));
        // rows in another order: each worker scores other rows, batched with others, than it generated
        const at::Tensor perm = torch::tensor({5, 2, 7, 0, 3, 6, 1, 4}, torch::kLong);
        for (const bool sampled : {true, false}) {
          CAPTURE(sampled);
          const DataProto p = prompts(8, 5, sampled ? 3 : 4);
          DataProto gen = wg.call(&ActorRolloutRefWorker::generate_sequences, sampled ? p : greedy(p, 6));
          const at::Tensor mine = gen.batch.at("rollout_log_probs");
          REQUIRE(mine.dtype() == torch::kFloat);
          CHECK(mine.ne(0).any().item<bool>());
          // the scoring temperature is the sampling one (rollout.temperature 1 here; greedy: 1)
          CHECK(torch::equal(mine, actor_log_probs(wg, gen, 1.0)));
          CHECK(torch::equal(mine.index_select(0, perm), actor_log_probs(wg, permuted(gen, perm), 1.0)));
          CHECK(torch::equal(mine.masked_select(gen.batch.at("response_mask").eq(0)),
                             torch::zeros({gen.batch.at("response_mask").eq(0).sum().item<int64_t>()})));
        }
        // and after an update, for the new weights
        DataProto gen_before = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(8, 5, 9));
        train_once(wg);
        DataProto gen = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(8, 5, 9));
        CHECK(torch::equal(gen.batch.at("rollout_log_probs"), actor_log_probs(wg, gen, 1.0)));
        CHECK_FALSE(torch::equal(actor_log_probs(wg, gen_before, 1.0), gen_before.batch.at("rollout_log_probs")));
      }
    }
  }
}

TEST_CASE(
    "a bf16 rollout (rollout.dtype=bfloat16) returns the engine's own log-probs: near the actor's float32 "
    "ones, not equal; continue_sequences' new columns too") {
  for (const auto& layout : {kLayouts[0], kLayouts[2]}) {
    SECTION(layout.name) {
      Runtime rt;
      auto wg =
          group(rt, layout.workers, "actor_rollout_ref", config_with(layout.fsdp_config, {{"dtype", "bfloat16"}}));
      DataProto gen = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(8, 5, 3));
      const at::Tensor mine = gen.batch.at("rollout_log_probs"), actor = actor_log_probs(wg, gen, 1.0);
      const at::Tensor mask = gen.batch.at("response_mask").to(torch::kBool);
      CHECK(torch::equal(mine.masked_select(~mask), torch::zeros({(~mask).sum().item<int64_t>()})));
      const at::Tensor diff = (mine - actor).abs().masked_select(mask);
      CAPTURE(diff.max().item<double>(), diff.mean().item<double>());
      CHECK(diff.max().item<double>() > 0.0);  // the bf16 forward's, not the actor's rescoring
      CHECK(diff.max().item<double>() < 0.3);
      CHECK(diff.mean().item<double>() < 0.05);
      // the first half of the responses, continued: the old columns are kept, the new ones the engine's
      DataProto half = gen;
      for (const char* key : {"responses", "response_mask", "rollout_log_probs"})
        half.batch.set(key, gen.batch.at(key).narrow(1, 0, 3).contiguous());
      const int64_t P = gen.batch.at("prompts").size(1);
      for (const char* key : {"input_ids", "attention_mask", "position_ids"})
        half.batch.set(key, gen.batch.at(key).narrow(1, 0, P + 3).contiguous());
      half.meta_info["response_length"] = 3;
      DataProto more = wg.call(&ActorRolloutRefWorker::continue_sequences, half);
      const at::Tensor lp = more.batch.at("rollout_log_probs");
      CHECK(torch::equal(lp.narrow(1, 0, 3), half.batch.at("rollout_log_probs")));
      const at::Tensor more_mask = more.batch.at("response_mask").narrow(1, 3, 3).to(torch::kBool);
      const at::Tensor more_diff =
          (lp.narrow(1, 3, 3) - actor_log_probs(wg, more, 1.0).narrow(1, 3, 3)).abs().masked_select(more_mask);
      if (more_diff.numel() > 0) CHECK(more_diff.max().item<double>() < 0.3);
    }
  }
}

TEST_CASE("rollout_log_probs at another sampling temperature are compute_log_prob's at that temperature") {
  Runtime rt;
  auto wg = group(rt, 2, "actor_rollout_ref", config_with({{"fsdp_size", -1}}, {{"temperature", 0.7}}));
  DataProto gen = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  CHECK(torch::equal(gen.batch.at("rollout_log_probs"), actor_log_probs(wg, gen, 0.7)));
  CHECK_FALSE(torch::equal(gen.batch.at("rollout_log_probs"), actor_log_probs(wg, gen, 1.0)));
}

TEST_CASE(
    "the rollout worker keeps its decode engine: unchanged weights are not repacked, an update gives the "
    "tokens of a fresh engine, a sharded policy holds no packed copy between rollouts") {
  for (const auto& layout : kLayouts) {
    SECTION(layout.name) {
      Runtime rt;
      auto wg = group(rt, layout.workers, "actor_rollout_ref", config_with(layout.fsdp_config));
      for (const auto& s : stats(wg)) CHECK_FALSE(s.at("engine").get<bool>());
      const DataProto p = prompts(8, 5, 21);

      DataProto first = wg.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 6));
      const int64_t all = stats(wg).front().at("packed_weights").get<int64_t>();
      CHECK(all == 2 * 7 + 1);  // q, k, v, o, gate, up, down per layer and the tied head
      for (const auto& s : stats(wg)) {
        CHECK(s.at("engine").get<bool>());
        CHECK(s.at("packed_weights").get<int64_t>() == all);
        // sharded: the gathered weights were freed, so is their packed copy
        if (layout.sharded)
          CHECK(s.at("packed_bytes").get<int64_t>() == 0);
        else
          CHECK(s.at("packed_bytes").get<int64_t>() > 0);
      }

      DataProto again = wg.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 6));
      CHECK(torch::equal(again.batch.at("responses"), first.batch.at("responses")));
      CHECK(torch::equal(again.batch.at("rollout_log_probs"), first.batch.at("rollout_log_probs")));
      for (const auto& s : stats(wg))  // replicated: nothing changed, nothing repacked
        CHECK(s.at("packed_weights").get<int64_t>() == (layout.sharded ? all : 0));

      train_once(wg);
      DataProto updated = wg.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 6));
      for (const auto& s : stats(wg)) CHECK(s.at("packed_weights").get<int64_t>() == all);  // AdamW moved every one
      const DataProto weights = exported(wg, 0);
      // the update changes these greedy tokens, so stale packed weights would show
      REQUIRE_FALSE(torch::equal(updated.batch.at("responses"), first.batch.at("responses")));
      const DataProto fresh = fresh_greedy(weights, p, 6);
      for (const char* key : {"responses", "response_mask", "input_ids", "attention_mask", "position_ids"})
        CHECK(torch::equal(updated.batch.at(key), fresh.batch.at(key)));
      CHECK(torch::equal(updated.batch.at("rollout_log_probs"), actor_log_probs(wg, updated, 1.0)));
    }
  }
}

TEST_CASE("a separate rollout worker repacks after load_weights: the tokens of a fresh engine on the new weights") {
  Runtime rt;
  auto actor = group(rt, 1, "actor_rollout_ref", config_with(Json::object()));
  auto rollout = group(rt, 1, "rollout", config_with(Json::object()));
  const DataProto p = prompts(8, 5, 21);
  DataProto before = rollout.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 6));
  rollout.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 6));
  CHECK(stats(rollout).front().at("packed_weights").get<int64_t>() == 0);

  train_once(actor);
  const DataProto weights = exported(actor, 1);
  rollout.call(&ActorRolloutRefWorker::load_weights, weights);
  DataProto after = rollout.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 6));
  CHECK(stats(rollout).front().at("packed_weights").get<int64_t>() == 2 * 7 + 1);
  REQUIRE_FALSE(torch::equal(after.batch.at("responses"), before.batch.at("responses")));
  CHECK(torch::equal(after.batch.at("responses"), fresh_greedy(weights, p, 6).batch.at("responses")));
  // the rollout group scores with the same code as the actor that produced the weights
  CHECK(torch::equal(after.batch.at("rollout_log_probs"), actor_log_probs(actor, after, 1.0)));
}

TEST_CASE(
    "continue_sequences on a sharded policy gathers it like generate_sequences: greedy 3 + 3 tokens equal 6, "
    "log-probs the actor's, the handoff figures reported") {
  for (const auto& layout : kLayouts) {
    SECTION(layout.name) {
      Runtime rt;
      auto wg = group(rt, layout.workers, "actor_rollout_ref", config_with(layout.fsdp_config));
      const DataProto p = prompts(8);
      DataProto whole = wg.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 6));
      DataProto part = wg.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 3));
      DataProto continued = wg.call(&ActorRolloutRefWorker::continue_sequences, greedy(part, 3));
      for (const char* key : {"responses", "response_mask", "input_ids", "attention_mask", "position_ids", "prompts"})
        CHECK(torch::equal(continued.batch.at(key), whole.batch.at(key)));
      // the new segment is scored on the whole row: bit for bit the actor's
      CHECK(torch::equal(continued.batch.at("rollout_log_probs").narrow(1, 3, 3),
                         actor_log_probs(wg, continued, 1.0).narrow(1, 3, 3)));
      CHECK(torch::equal(continued.batch.at("rollout_log_probs").narrow(1, 0, 3), part.batch.at("rollout_log_probs")));
      const double reshard_s = continued.meta_info.at("timing").at("reshard").get<double>();
      const int64_t peak = continued.meta_info.at("reshard_peak_extra_bytes").get<int64_t>();
      if (layout.sharded) {
        CHECK(reshard_s > 0);
        CHECK(peak == full_parameter_bytes());
      } else {
        CHECK(reshard_s == 0);
        CHECK(peak == 0);
      }
    }
  }
}

TEST_CASE(
    "partial rollout across a weight update: each segment's log-probs are those of the version that "
    "generated it") {
  Runtime rt;
  auto actor = group(rt, 1, "actor_rollout_ref", config_with(Json::object()));
  auto initial = group(rt, 1, "actor_rollout_ref", config_with(Json::object()));  // stays at version 1
  auto rollout = group(rt, 1, "rollout", config_with(Json::object()));
  rollout.call(&ActorRolloutRefWorker::load_weights, exported(actor, 1));
  DataProto p = prompts(16);
  p.meta_info["response_length"] = 3;
  DataProto part = rollout.call(&ActorRolloutRefWorker::generate_sequences, p);
  CHECK(torch::equal(part.batch.at("rollout_log_probs"), actor_log_probs(initial, part, 1.0)));
  train_once(actor);
  rollout.call(&ActorRolloutRefWorker::load_weights, exported(actor, 2));
  part.meta_info["response_length"] = 4;
  DataProto out = rollout.call(&ActorRolloutRefWorker::continue_sequences, part);
  const at::Tensor lp = out.batch.at("rollout_log_probs");
  CHECK(torch::equal(lp.narrow(1, 0, 3), part.batch.at("rollout_log_probs")));                // version 1's, kept
  CHECK(torch::equal(lp.narrow(1, 3, 4), actor_log_probs(actor, out, 1.0).narrow(1, 3, 4)));  // version 2's
  CHECK_FALSE(torch::equal(lp.narrow(1, 3, 4), actor_log_probs(initial, out, 1.0).narrow(1, 3, 4)));
  CHECK(lp.narrow(1, 3, 4).ne(0).any().item<bool>());
}
