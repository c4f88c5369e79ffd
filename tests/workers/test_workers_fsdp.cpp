// The roles under FSDP (actor_rollout_ref.actor.strategy / fsdp_config): sharded groups of 2
// and 4 in-process workers against one worker, the rollout handoff, dynamic batch sizes and
// the critic.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using hyflow::workers::CriticWorker;
using namespace workers_test;

namespace {
WorkerGroup actor_group(Runtime& rt, int ws, const Json& config) {
  hyflow::workers::register_workers();
  WorkerGroup wg(rt, ResourcePool({ws}),
                 WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", "actor_rollout_ref"}}});
  wg.call(&ActorRolloutRefWorker::init_model);
  return wg;
}

Json with_fsdp(Json config, const Json& fsdp_config) {
  config["actor"]["fsdp_config"] = fsdp_config;
  config["ref"]["fsdp_config"] = fsdp_config;
  return config;
}

bool all_same(const std::vector<std::string>& v) {
  return std::all_of(v.begin(), v.end(), [&](auto& s) { return s == v[0]; });
}

std::vector<double> grad_norms(const DataProto& out) {
  std::vector<double> flat;
  const Json& values = out.meta_info.at("metrics").at("actor/grad_norm");
  for (const auto& rank_values : values) {
    if (rank_values.is_number()) {
      flat.push_back(rank_values.get<double>());
    } else {
      for (const auto& v : rank_values) flat.push_back(v.get<double>());
    }
  }
  return flat;
}

at::Tensor saved_weights(WorkerGroup& wg, const std::string& tag) {
  TempDir dir(tag);
  wg.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{1});
  return flat_parameters(*models::load_causal_lm(dir.path));
}
}  // namespace

TEST_CASE("sharded actor on 2 and 4 workers: log-probs and greedy rollouts equal one worker's, updates agree") {
  Runtime rt;
  // one mini-batch of 8 rows, micro-batches of 2 (gradient accumulation), two epochs, KL loss
  const auto base = actor_rollout_ref_config(
      8, {{"ppo_epochs", 2}, {"use_kl_loss", true}, {"kl_loss_coef", 0.1}, {"entropy_coeff", 0.01}});
  auto one = actor_group(rt, 1, base);
  DataProto gen = one.call(&ActorRolloutRefWorker::generate_sequences, prompts(8));
  DataProto lp1 = one.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  DataProto ref1 = one.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen);
  DataProto greedy_in = prompts(8, 5, 11);
  greedy_in.meta_info["validate"] = true;
  DataProto greedy1 = one.call(&ActorRolloutRefWorker::generate_sequences, greedy_in);
  DataProto batch = gen;
  batch.union_with(lp1.select(std::vector<std::string>{"old_log_probs"}));
  batch.union_with(ref1);
  batch = with_advantages(batch, 4);
  const auto w0 = flat_parameters(*models::load_causal_lm(tiny_model_dir()));
  const auto norms1 = grad_norms(one.call(&ActorRolloutRefWorker::update_actor, batch));
  const auto w1 = saved_weights(one, "one");
  const double update = (w1 - w0).abs().max().item<double>();
  REQUIRE(update > 1e-4);

  struct Case {
    const char* name;
    int workers;
    Json fsdp_config;
  };
  for (const auto& c :
       {Case{"FULL_SHARD", 2, {{"fsdp_size", -1}}}, Case{"SHARD_GRAD_OP", 2, {{"reshard_after_forward", false}}},
        Case{"FULL_SHARD, min_num_params puts every layer in the root unit",
             2,
             {{"wrap_policy", {{"min_num_params", 1000000}}}}},
        Case{"NO_SHARD", 2, {{"fsdp_size", 1}}}, Case{"FULL_SHARD", 4, {{"fsdp_size", -1}}},
        Case{"HYBRID_SHARD", 4, {{"fsdp_size", 2}}}}) {
    SECTION(std::string(c.name) + " on " + std::to_string(c.workers) + " workers") {
      auto wg = actor_group(rt, c.workers, with_fsdp(base, c.fsdp_config));
      // same weights: the sharded forward computes what the model's forward computes, bit for bit
      DataProto lp = wg.call(&ActorRolloutRefWorker::compute_log_prob, gen);
      CHECK(torch::equal(lp.batch.at("old_log_probs"), lp1.batch.at("old_log_probs")));
      CHECK(torch::equal(lp.batch.at("entropys"), lp1.batch.at("entropys")));
      DataProto ref = wg.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen);  // other micro-batch shapes
      CHECK(torch::allclose(ref.batch.at("ref_log_prob"), ref1.batch.at("ref_log_prob"), 1e-5, 1e-6));
      // the rollout handoff gathers the full policy: the generations are the unsharded ones
      DataProto greedy = wg.call(&ActorRolloutRefWorker::generate_sequences, greedy_in);
      CHECK(torch::equal(greedy.batch.at("responses"), greedy1.batch.at("responses")));
      CHECK(torch::allclose(greedy.batch.at("rollout_log_probs"), greedy1.batch.at("rollout_log_probs"), 1e-5, 1e-6));

      const auto norms = grad_norms(wg.call(&ActorRolloutRefWorker::update_actor, batch));
      REQUIRE(norms.size() == static_cast<size_t>(2 * c.workers));  // two epochs per rank
      for (size_t i = 0; i < norms.size(); ++i) CHECK(norms[i] == Approx(norms1[i % 2]).epsilon(1e-4));
      CHECK(all_same(wg.call(&ActorRolloutRefWorker::parameter_digest)));
      // Adam turns rounding noise of near-zero gradients into lr-sized steps: compare to the update
      const auto w = saved_weights(wg, "sharded");
      CAPTURE(update, (w - w1).abs().max().item<double>());
      CHECK((w - w1).abs().max().item<double>() < 0.01 * update);
    }
  }
}

TEST_CASE("sharded ranks with uneven dynamic micro-batch counts agree on the count and finish") {
  Runtime rt;
  // rank 0 gets short rows, rank 1 long ones: alone they would split into different counts,
  // and every sharded micro-batch is a collective
  auto config = actor_rollout_ref_config(4, {{"use_dynamic_bsz", true}, {"ppo_max_token_len_per_gpu", 14}});
  config["rollout"]["log_prob_use_dynamic_bsz"] = true;
  config["rollout"]["log_prob_max_token_len_per_gpu"] = 14;
  auto wg = actor_group(rt, 2, config);
  auto one = actor_group(rt, 1, config);
  DataProto gen = one.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  auto mask = gen.batch.at("attention_mask").clone();
  mask.narrow(0, 0, 2).narrow(1, 0, 4).fill_(0);  // rows 0, 1 (rank 0) are shorter
  gen.batch.set("attention_mask", mask);
  DataProto lp = wg.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  DataProto lp1 = one.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  CHECK(torch::allclose(lp.batch.at("old_log_probs"), lp1.batch.at("old_log_probs"), 1e-5, 1e-6));
  gen.union_with(lp.select(std::vector<std::string>{"old_log_probs"}));
  DataProto out = wg.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen));
  for (double v : grad_norms(out)) CHECK(std::isfinite(v));
  CHECK(all_same(wg.call(&ActorRolloutRefWorker::parameter_digest)));
}

TEST_CASE("sharded critic on 2 workers: ranks in sync, its checkpoint is a Hugging Face folder one worker loads") {
  Runtime rt;
  hyflow::workers::register_workers();
  auto critic = [&](int ws, const Json& config) {
    WorkerGroup wg(rt, ResourcePool({ws}), WorkerSpec{"CriticWorker", {{"config", config}}});
    wg.call(&CriticWorker::init_model);
    return wg;
  };
  auto two = critic(2, critic_config(4));
  auto actor = actor_group(rt, 1, actor_rollout_ref_config(4));
  DataProto gen = actor.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  DataProto v2 = two.call(&CriticWorker::compute_values, gen);
  gen.union_with(v2);
  gen.batch.set("returns", v2.batch.at("values") + 0.5 * gen.batch.at("response_mask"));
  two.call(&CriticWorker::update_critic, gen);
  CHECK(all_same(two.call(&CriticWorker::parameter_digest)));
  DataProto after = two.call(&CriticWorker::compute_values, gen);
  CHECK_FALSE(torch::equal(after.batch.at("values"), v2.batch.at("values")));

  TempDir dir("critic");
  two.call(&CriticWorker::save_checkpoint, dir.path.string(), int64_t{1});
  auto config = critic_config(4);
  config["model"]["path"] = dir.path.string();
  auto one = critic(1, config);  // the trained value head and transformer, gathered from the shards
  DataProto v1 = one.call(&CriticWorker::compute_values, gen);
  CHECK(torch::allclose(v1.batch.at("values"), after.batch.at("values"), 1e-5, 1e-6));
}

TEST_CASE("bf16 compute with fp32 master shards trains on 2 workers and stays close to fp32") {
  Runtime rt;
  const auto base = actor_rollout_ref_config(4);
  auto fp32 = actor_group(rt, 2, base);
  auto bf16 =
      actor_group(rt, 2, with_fsdp(base, {{"mixed_precision", {{"param_dtype", "bf16"}, {"reduce_dtype", "fp32"}}}}));
  DataProto gen = fp32.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  DataProto a = fp32.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  DataProto b = bf16.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  CHECK_FALSE(torch::equal(a.batch.at("old_log_probs"), b.batch.at("old_log_probs")));  // bf16 really computes
  CHECK(torch::allclose(a.batch.at("old_log_probs"), b.batch.at("old_log_probs"), 0.05, 0.1));
  gen.union_with(a.select(std::vector<std::string>{"old_log_probs"}));
  for (double v : grad_norms(bf16.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen))))
    CHECK(std::isfinite(v));
  CHECK(all_same(bf16.call(&ActorRolloutRefWorker::parameter_digest)));
}
