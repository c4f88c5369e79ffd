// The trainer -> rollout weight handoff of ActorRolloutRefWorker (export_weights / load_weights),
// the weight version every rollout row records, and partial rollouts (continue_sequences).
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using namespace workers_test;

namespace {
WorkerGroup group(Runtime& rt, int ws, const std::string& role, Json config = actor_rollout_ref_config()) {
  hyflow::workers::register_workers();
  WorkerGroup wg(rt, ResourcePool({ws}), WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", role}}});
  wg.call(&ActorRolloutRefWorker::init_model);
  return wg;
}

std::vector<std::string> digests(WorkerGroup& wg) { return wg.call(&ActorRolloutRefWorker::parameter_digest); }

/// One PPO update of the actor on its own rollout, so its weights leave the initial ones.
void train_once(WorkerGroup& actor) {
  DataProto gen = actor.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  gen.union_with(DataProto(actor.call(&ActorRolloutRefWorker::compute_log_prob, gen))
                     .select(std::vector<std::string>{"old_log_probs"}));
  actor.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen));
}

DataProto exported(WorkerGroup& actor, int64_t version) {
  const Value parts = actor.call(&ActorRolloutRefWorker::export_weights);
  REQUIRE(parts.is_list());
  REQUIRE(static_cast<int>(parts.list().size()) == actor.world_size());
  DataProto weights = parts.list().front().dataproto();
  weights.meta_info["weight_version"] = version;
  return weights;
}

DataProto greedy(DataProto p, int64_t length) {
  p.meta_info["validate"] = true;
  p.meta_info["response_length"] = length;
  return p;
}
}  // namespace

TEST_CASE("export_weights of a trained actor loaded into a rollout group of 2: identical weights, the same greedy "
          "rollouts, the version on every row") {
  Runtime rt;
  WorkerGroup actor = group(rt, 1, "actor_rollout_ref");
  WorkerGroup rollout = group(rt, 2, "rollout");
  train_once(actor);
  const std::string trained = digests(actor).at(0);
  CHECK(digests(rollout) != std::vector<std::string>{trained, trained});

  DataProto before = rollout.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  CHECK_FALSE(before.batch.contains("min_weight_version"));  // no versioned weights yet
  CHECK(std::vector<int64_t>(rollout.call(&ActorRolloutRefWorker::weight_version)) == std::vector<int64_t>{-1, -1});

  const DataProto weights = exported(actor, 3);
  CHECK(weights.size() == 1);
  CHECK(weights.meta_info.at("num_parameters").get<int64_t>() == static_cast<int64_t>(weights.batch.size()));
  rollout.call(&ActorRolloutRefWorker::load_weights, weights);
  CHECK(digests(rollout) == std::vector<std::string>{trained, trained});
  CHECK(std::vector<int64_t>(rollout.call(&ActorRolloutRefWorker::weight_version)) == std::vector<int64_t>{3, 3});

  DataProto mine = rollout.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(6), 6));
  DataProto theirs = actor.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(6), 6));
  CHECK(torch::equal(mine.batch.at("responses"), theirs.batch.at("responses")));
  CHECK(torch::equal(mine.batch.at("min_weight_version"), torch::full({6}, 3, torch::kLong)));
  CHECK(torch::equal(mine.batch.at("max_weight_version"), torch::full({6}, 3, torch::kLong)));

  SECTION("the export is a copy: training on does not change what was handed over") {
    train_once(actor);
    CHECK(digests(actor).at(0) != trained);
    rollout.call(&ActorRolloutRefWorker::load_weights, weights);
    CHECK(digests(rollout) == std::vector<std::string>{trained, trained});
  }
}

TEST_CASE("load_weights refuses a missing version, a missing or misshapen tensor; the roles are checked") {
  Runtime rt;
  WorkerGroup actor = group(rt, 1, "actor_rollout_ref");
  WorkerGroup rollout = group(rt, 1, "rollout");
  DataProto weights = exported(actor, 1);

  DataProto unversioned = weights;
  unversioned.meta_info.erase("weight_version");
  CHECK_THROWS_WITH(rollout.call(&ActorRolloutRefWorker::load_weights, unversioned),
                    Catch::Contains("weight_version"));

  const std::string name = weights.batch.keys().front();
  DataProto missing = weights;
  missing.batch.pop(name);
  CHECK_THROWS_WITH(rollout.call(&ActorRolloutRefWorker::load_weights, missing),
                    Catch::Contains(name) && Catch::Contains("missing"));

  DataProto misshapen = weights;
  misshapen.batch.set(name, torch::zeros({1, 3}));
  CHECK_THROWS_WITH(rollout.call(&ActorRolloutRefWorker::load_weights, misshapen),
                    Catch::Contains(name) && Catch::Contains("shape"));
  CHECK(std::vector<int64_t>(rollout.call(&ActorRolloutRefWorker::weight_version)) == std::vector<int64_t>{-1});

  CHECK_THROWS_WITH(rollout.call(&ActorRolloutRefWorker::export_weights), Catch::Contains("actor role"));
  WorkerGroup ref = group(rt, 1, "ref");
  CHECK_THROWS_WITH(ref.call(&ActorRolloutRefWorker::load_weights, weights), Catch::Contains("rollout role"));
}

TEST_CASE("partial rollout: greedy 3 tokens continued by 3 on the same weights equal 6 tokens in one go") {
  Runtime rt;
  WorkerGroup rollout = group(rt, 2, "rollout");
  const DataProto p = prompts(6);
  DataProto whole = rollout.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 6));
  DataProto part = rollout.call(&ActorRolloutRefWorker::generate_sequences, greedy(p, 3));
  DataProto continued = rollout.call(&ActorRolloutRefWorker::continue_sequences, greedy(part, 3));
  for (const char* key : {"responses", "response_mask", "input_ids", "attention_mask", "position_ids", "prompts"})
    CHECK(torch::equal(continued.batch.at(key), whole.batch.at(key)));
  CHECK(torch::allclose(continued.batch.at("rollout_log_probs"), whole.batch.at("rollout_log_probs"), 1e-5, 1e-6));
}

TEST_CASE("partial rollout across a weight update: tokens and log-probs kept, open rows go on with the new version, "
          "ended rows are padded") {
  Runtime rt;
  WorkerGroup actor = group(rt, 1, "actor_rollout_ref");
  WorkerGroup rollout = group(rt, 1, "rollout");
  rollout.call(&ActorRolloutRefWorker::load_weights, exported(actor, 1));
  DataProto p = prompts(16);
  p.meta_info["response_length"] = 3;
  DataProto part = rollout.call(&ActorRolloutRefWorker::generate_sequences, p);
  train_once(actor);
  rollout.call(&ActorRolloutRefWorker::load_weights, exported(actor, 2));
  part.meta_info["response_length"] = 4;
  DataProto out = rollout.call(&ActorRolloutRefWorker::continue_sequences, part);

  const auto& b = out.batch;
  REQUIRE(b.at("responses").size(1) == 7);
  CHECK(torch::equal(b.at("responses").narrow(1, 0, 3), part.batch.at("responses")));
  CHECK(torch::equal(b.at("rollout_log_probs").narrow(1, 0, 3), part.batch.at("rollout_log_probs")));
  CHECK(torch::equal(b.at("input_ids"), torch::cat({b.at("prompts"), b.at("responses")}, 1)));
  int open = 0, ended = 0;
  for (int64_t r = 0; r < 16; ++r) {
    const auto first = part.batch.at("responses")[r];
    const bool was_open = part.batch.at("response_mask")[r][2].item<int64_t>() == 1 && first[2].item<int64_t>() != kEos;
    const auto more_mask = b.at("response_mask")[r].narrow(0, 3, 4);
    if (was_open) {
      ++open;
      CHECK(more_mask[0].item<int64_t>() == 1);  // it went on
      CHECK(b.at("min_weight_version")[r].item<int64_t>() == 1);
      CHECK(b.at("max_weight_version")[r].item<int64_t>() == 2);
    } else {
      ++ended;
      CHECK(more_mask.sum().item<int64_t>() == 0);
      CHECK(torch::equal(b.at("responses")[r].narrow(0, 3, 4), torch::full({4}, kPad, torch::kLong)));
      CHECK(b.at("max_weight_version")[r].item<int64_t>() == 1);
    }
  }
  CHECK(open > 0);
  CHECK(ended > 0);

  DataProto no_log_probs = part;
  no_log_probs.batch.pop("rollout_log_probs");
  CHECK_THROWS_WITH(rollout.call(&ActorRolloutRefWorker::continue_sequences, no_log_probs),
                    Catch::Contains("calculate_log_probs"));
}
