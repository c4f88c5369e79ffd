// ActorRolloutRefWorker through WorkerGroups of 1 and 2 in-process workers: every method,
// data-parallel equivalence, checkpoint round trips and role checks.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using namespace workers_test;

namespace {
WorkerGroup actor_group(Runtime& rt, int ws, Json config, const std::string& role = "actor_rollout_ref") {
  hyflow::workers::register_workers();
  WorkerGroup wg(rt, ResourcePool({ws}), WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", role}}});
  wg.call(&ActorRolloutRefWorker::init_model);
  return wg;
}

std::vector<std::string> digests(WorkerGroup& wg) { return wg.call(&ActorRolloutRefWorker::parameter_digest); }

bool all_same(const std::vector<std::string>& v) {
  return std::all_of(v.begin(), v.end(), [&](auto& s) { return s == v[0]; });
}

/// generate -> old/ref log-probs -> advantages: the input of update_actor.
DataProto training_batch(WorkerGroup& wg, int64_t rows, uint64_t seed = 3) {
  DataProto gen = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(rows, 5, seed));
  DataProto old_lp = wg.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  DataProto ref_lp = wg.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen);
  gen.union_with(old_lp.select(std::vector<std::string>{"old_log_probs"}));
  gen.union_with(ref_lp);
  return with_advantages(gen, seed + 1);
}

/// One list per rank. A group of one returns its worker's metrics without a concat
/// (actors' collect_concat skips DataProto::concat for a single part), so the lists are not
/// nested there.
std::vector<std::vector<double>> per_rank(const Json& metrics, const std::string& name) {
  const Json& values = metrics.at(name);
  if (!values.empty() && values.front().is_number()) return {values.get<std::vector<double>>()};
  return values.get<std::vector<std::vector<double>>>();
}

std::vector<double> flat_metric(const Json& metrics, const std::string& name) {
  std::vector<double> out;
  for (const auto& rank_values : per_rank(metrics, name)) out.insert(out.end(), rank_values.begin(), rank_values.end());
  return out;
}

const Json& metrics_of(const DataProto& out) { return out.meta_info.at("metrics"); }
}  // namespace

TEST_CASE("actor_rollout_ref on 1 and 2 workers: rollout keys, log-probs, ref log-probs and an update in sync") {
  Runtime rt;
  for (int ws : {1, 2}) {
    CAPTURE(ws);
    auto wg = actor_group(rt, ws, actor_rollout_ref_config(4));
    const auto before = digests(wg);
    REQUIRE(before.size() == static_cast<size_t>(ws));
    CHECK(all_same(before));

    DataProto gen = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
    for (const char* key : {"prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask",
                            "rollout_log_probs"})
      CHECK(gen.batch.contains(key));
    CHECK(gen.size() == 4);
    CHECK(gen.batch.at("responses").sizes() == at::IntArrayRef({4, 6}));
    CHECK(gen.batch.at("input_ids").sizes() == at::IntArrayRef({4, 11}));
    CHECK(torch::equal(gen.batch.at("prompts"), prompts(4).batch.at("input_ids")));

    DataProto lp = wg.call(&ActorRolloutRefWorker::compute_log_prob, gen);
    CHECK(lp.batch.at("old_log_probs").sizes() == at::IntArrayRef({4, 6}));
    CHECK(lp.batch.at("entropys").sizes() == at::IntArrayRef({4, 6}));
    CHECK(lp.meta_info.at("temperature") == 1.0);
    const auto mask = gen.batch.at("response_mask").to(torch::kBool);
    // the rollout's own log-probs agree with the recomputed ones on response tokens
    CHECK(torch::allclose(gen.batch.at("rollout_log_probs").masked_select(mask),
                          lp.batch.at("old_log_probs").masked_select(mask), 1e-4, 1e-4));
    DataProto ref = wg.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen);
    CHECK(torch::allclose(ref.batch.at("ref_log_prob"), lp.batch.at("old_log_probs"), 1e-5, 1e-6));

    gen.union_with(lp.select(std::vector<std::string>{"old_log_probs"}));
    gen.union_with(ref);
    DataProto out = wg.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen));
    const Json& metrics = metrics_of(out);
    for (const char* name : {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower",
                             "actor/grad_norm", "actor/lr"}) {
      CAPTURE(name);
      REQUIRE(metrics.contains(name));
      REQUIRE(per_rank(metrics, name).size() == static_cast<size_t>(ws));
      for (double v : flat_metric(metrics, name)) CHECK(std::isfinite(v));
    }
    CHECK(flat_metric(metrics, "actor/lr")[0] == Approx(1e-2));
    CHECK(flat_metric(metrics, "actor/grad_norm")[0] > 0);

    const auto after = digests(wg);
    CHECK(all_same(after));
    CHECK(after[0] != before[0]);
    // the reference policy stays frozen, the policy moved
    DataProto ref_after = wg.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen);
    CHECK(torch::equal(ref_after.batch.at("ref_log_prob"), ref.batch.at("ref_log_prob")));
    DataProto lp_after = wg.call(&ActorRolloutRefWorker::compute_log_prob, gen);
    CHECK_FALSE(torch::allclose(lp_after.batch.at("old_log_probs"), lp.batch.at("old_log_probs")));
  }
}

TEST_CASE("greedy rollout (validate uses val_kwargs) is the same on 1 and 2 workers; an odd batch is padded") {
  Runtime rt;
  auto one = actor_group(rt, 1, actor_rollout_ref_config(4));
  auto two = actor_group(rt, 2, actor_rollout_ref_config(4));
  auto p = prompts(5);
  p.meta_info["validate"] = true;
  p.meta_info[kAutoPaddingKey] = true;
  DataProto a = one.call(&ActorRolloutRefWorker::generate_sequences, p);
  DataProto b = two.call(&ActorRolloutRefWorker::generate_sequences, p);
  REQUIRE(b.size() == 5);
  CHECK(torch::equal(a.batch.at("responses"), b.batch.at("responses")));
  DataProto again = one.call(&ActorRolloutRefWorker::generate_sequences, p);
  CHECK(torch::equal(a.batch.at("responses"), again.batch.at("responses")));
  // response_length override through meta_info
  auto shorter = prompts(2);
  shorter.meta_info["response_length"] = 3;
  shorter.meta_info["do_sample"] = false;
  DataProto s = one.call(&ActorRolloutRefWorker::generate_sequences, shorter);
  CHECK(s.batch.at("responses").size(1) == 3);
}

TEST_CASE("sampled rollouts differ from call to call: the rollout generator advances") {
  Runtime rt;
  auto wg = actor_group(rt, 1, actor_rollout_ref_config(4));
  DataProto a = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(8));
  DataProto b = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(8));
  CHECK_FALSE(torch::equal(a.batch.at("responses"), b.batch.at("responses")));
}

TEST_CASE("data parallel: 2 workers update like 1 worker on the same batch, weights identical on both ranks") {
  Runtime rt;
  // one mini-batch per rank (8 rows, 4 per rank), micro-batches of 2, two epochs, KL loss and
  // an entropy bonus: the averaged gradient equals the single-worker one.
  auto config = actor_rollout_ref_config(
      8, {{"ppo_epochs", 2}, {"use_kl_loss", true}, {"kl_loss_coef", 0.1}, {"entropy_coeff", 0.01}});
  // the sharded group's checkpoint also holds the gathered Hugging Face folder read below
  config["actor"]["checkpoint"] = {{"save_contents", {"model", "optimizer", "extra", "hf_model"}}};
  auto one = actor_group(rt, 1, config);
  auto two = actor_group(rt, 2, config);
  DataProto batch = training_batch(one, 8);
  DataProto m1 = one.call(&ActorRolloutRefWorker::update_actor, batch);
  DataProto m2 = two.call(&ActorRolloutRefWorker::update_actor, batch);
  CHECK(all_same(digests(two)));

  TempDir d1("dp1"), d2("dp2");
  one.call(&ActorRolloutRefWorker::save_checkpoint, d1.path.string(), int64_t{1});
  two.call(&ActorRolloutRefWorker::save_checkpoint, d2.path.string(), int64_t{1});
  auto w1 = flat_parameters(*models::load_causal_lm(d1.path));
  auto w2 = flat_parameters(*models::load_causal_lm(d2.path));
  auto w0 = flat_parameters(*models::load_causal_lm(tiny_model_dir()));
  CHECK((w1 - w0).abs().max().item<double>() > 1e-4);  // the update moved the weights
  // Adam turns float-rounding noise in near-zero gradients into lr-sized steps, so compare
  // against the size of the update: a wrong reduction (sum, or none) differs by the update.
  const double update = (w1 - w0).abs().max().item<double>();
  CAPTURE(update, (w1 - w2).abs().max().item<double>());
  CHECK((w1 - w2).abs().max().item<double>() < 0.01 * update);

  // grad norms per mini-batch (one per epoch) agree; each rank reports the same norm
  const auto g1 = flat_metric(metrics_of(m1), "actor/grad_norm");
  const auto g2 = per_rank(metrics_of(m2), "actor/grad_norm");
  REQUIRE(g1.size() == 2);
  REQUIRE(g2.size() == 2);
  for (int r = 0; r < 2; ++r)
    for (int e = 0; e < 2; ++e) CHECK(g2.at(r).at(e) == Approx(g1[e]).epsilon(1e-4));
  for (const char* name : {"actor/kl_loss", "actor/kl_coef", "actor/entropy"}) CHECK(metrics_of(m2).contains(name));
}

TEST_CASE("dynamic batch size: one micro-batch per mini-batch updates exactly like fixed micro-batches of the whole") {
  Runtime rt;
  auto fixed = actor_group(rt, 1, actor_rollout_ref_config(4, {{"ppo_micro_batch_size_per_gpu", 4}}));
  auto dynamic =
      actor_group(rt, 1, actor_rollout_ref_config(4, {{"use_dynamic_bsz", true}, {"ppo_max_token_len_per_gpu", 1000}}));
  auto small =
      actor_group(rt, 1, actor_rollout_ref_config(4, {{"use_dynamic_bsz", true}, {"ppo_max_token_len_per_gpu", 12}}));
  DataProto batch = training_batch(fixed, 4);
  fixed.call(&ActorRolloutRefWorker::update_actor, batch);
  dynamic.call(&ActorRolloutRefWorker::update_actor, batch);
  CHECK(digests(fixed)[0] == digests(dynamic)[0]);
  DataProto out = small.call(&ActorRolloutRefWorker::update_actor, batch);
  for (double v : flat_metric(metrics_of(out), "actor/pg_loss")) CHECK(std::isfinite(v));
  CHECK(flat_metric(metrics_of(out), "actor/pg_clipfrac").size() > 1);  // several micro-batches
}

TEST_CASE("checkpoint: save then load restores weights, optimizer, lr schedule and RNG; the next step is identical") {
  Runtime rt;
  for (int ws : {1, 2}) {
    CAPTURE(ws);
    auto config = actor_rollout_ref_config(4, {{"optim", {{"lr", 1e-2}, {"lr_warmup_steps", 3}}}});
    auto a = actor_group(rt, ws, config);
    DataProto batch = training_batch(a, 4);
    a.call(&ActorRolloutRefWorker::update_actor, batch);
    TempDir dir("ckpt");
    a.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{1});
    CHECK(std::filesystem::exists(dir.path / "tokenizer_config.json"));
    if (ws == 1) {  // replicated: the Hugging Face folder and per-rank optimizer files
      CHECK(std::filesystem::exists(dir.path / "config.json"));
      CHECK(std::filesystem::exists(dir.path / "model.safetensors"));
      CHECK(std::filesystem::exists(dir.path / "optim_world_size_1_rank_0.pt"));
    } else {  // sharded (FULL_SHARD by default): parameter and optimizer shards with a manifest
      CHECK(std::filesystem::exists(dir.path / "fsdp_manifest.json"));
      CHECK(std::filesystem::exists(dir.path / "model_shard_1_of_2.bin"));
      CHECK(std::filesystem::exists(dir.path / "optim_shard_1_of_2.bin"));
    }

    DataProto next_a = a.call(&ActorRolloutRefWorker::update_actor, batch);
    DataProto gen_a = a.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));

    auto b = actor_group(rt, ws, config);
    b.call(&ActorRolloutRefWorker::load_checkpoint, dir.path.string());
    DataProto next_b = b.call(&ActorRolloutRefWorker::update_actor, batch);
    DataProto gen_b = b.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
    CHECK(digests(a) == digests(b));
    CHECK(metrics_of(next_a).at("actor/lr") == metrics_of(next_b).at("actor/lr"));
    CHECK(flat_metric(metrics_of(next_b), "actor/lr")[0] == Approx(1e-2 / 3.0));
    CHECK(torch::equal(gen_a.batch.at("responses"), gen_b.batch.at("responses")));
  }
}

TEST_CASE("checkpoint errors: another world size or a missing directory fail naming it") {
  Runtime rt;
  auto one = actor_group(rt, 1, actor_rollout_ref_config(4));
  TempDir dir("ckpt_ws");
  one.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{3});
  auto two = actor_group(rt, 2, actor_rollout_ref_config(4));
  CHECK_THROWS_WITH(two.call(&ActorRolloutRefWorker::load_checkpoint, dir.path.string()),
                    Catch::Contains("1 workers") && Catch::Contains("this group has 2"));
  CHECK_THROWS_WITH(one.call(&ActorRolloutRefWorker::load_checkpoint, (dir.path / "nope").string()),
                    Catch::Contains("nope"));
}

TEST_CASE("roles limit methods: a ref worker cannot generate or update; update_actor names missing keys") {
  Runtime rt;
  auto ref = actor_group(rt, 1, actor_rollout_ref_config(4), "ref");
  CHECK_THROWS_WITH(ref.call(&ActorRolloutRefWorker::generate_sequences, prompts(2)),
                    Catch::Contains("needs the rollout role") && Catch::Contains("ref"));
  auto actor = actor_group(rt, 1, actor_rollout_ref_config(4), "actor");
  DataProto gen = actor_group(rt, 1, actor_rollout_ref_config(4), "rollout")
                      .call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  CHECK_THROWS_WITH(actor.call(&ActorRolloutRefWorker::update_actor, gen),
                    Catch::Contains("update_actor") && Catch::Contains("'advantages'"));
  CHECK_THROWS_WITH(
      WorkerGroup(rt, ResourcePool({2}),
                  WorkerSpec{"ActorRolloutRefWorker", {{"config", actor_rollout_ref_config(3)}, {"role", "actor"}}}),
      Catch::Contains("ppo_mini_batch_size"));
}

TEST_CASE("every registered policy loss and loss_agg_mode runs an update with finite metrics") {
  Runtime rt;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"vanilla", "seq-mean-token-mean"}, {"vanilla", "seq-mean-token-sum"}, {"vanilla", "seq-mean-token-sum-norm"},
      {"gspo", "token-mean"}, {"sapo", "token-mean"}, {"gpg", "token-mean"}, {"clip_cov", "token-mean"},
      {"kl_cov", "token-mean"}, {"geo_mean", "token-mean"}, {"cispo", "token-mean"}};
  auto sampler = actor_group(rt, 1, actor_rollout_ref_config(4));
  DataProto batch = training_batch(sampler, 4);
  for (const auto& [mode, agg] : cases) {
    CAPTURE(mode, agg);
    auto wg = actor_group(rt, 1,
                          actor_rollout_ref_config(
                              4, {{"ppo_epochs", 2}, {"loss_agg_mode", agg}, {"policy_loss", {{"loss_mode", mode}}}}));
    const auto before = digests(wg);
    DataProto out = wg.call(&ActorRolloutRefWorker::update_actor, batch);
    for (auto it = metrics_of(out).begin(); it != metrics_of(out).end(); ++it)
      for (double v : flat_metric(metrics_of(out), it.key())) CHECK(std::isfinite(v));
    CHECK(digests(wg) != before);
  }
}

TEST_CASE("log-probs with dynamic batch size come back in input order, equal to fixed micro-batches") {
  Runtime rt;
  auto fixed = actor_group(rt, 2, actor_rollout_ref_config(4));
  auto config = actor_rollout_ref_config(4);
  config["rollout"]["log_prob_use_dynamic_bsz"] = true;
  config["rollout"]["log_prob_max_token_len_per_gpu"] = 14;
  config["ref"] = {{"log_prob_use_dynamic_bsz", true}, {"log_prob_max_token_len_per_gpu", 12}};
  auto dynamic = actor_group(rt, 2, config);
  auto p = prompts(6);
  p.meta_info["do_sample"] = false;
  DataProto gen = fixed.call(&ActorRolloutRefWorker::generate_sequences, p);
  DataProto a = fixed.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  DataProto b = dynamic.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  CHECK(torch::allclose(a.batch.at("old_log_probs"), b.batch.at("old_log_probs"), 1e-5, 1e-5));
  CHECK(torch::allclose(a.batch.at("entropys"), b.batch.at("entropys"), 1e-5, 1e-5));
  DataProto r = dynamic.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen);
  CHECK(torch::allclose(r.batch.at("ref_log_prob"), a.batch.at("old_log_probs"), 1e-5, 1e-5));
}

TEST_CASE("a non-finite gradient skips the step on every rank: weights unchanged, grad_norm reported as is") {
  Runtime rt;
  auto wg = actor_group(rt, 2, actor_rollout_ref_config(4));
  DataProto batch = training_batch(wg, 4);
  auto advantages = batch.batch.at("advantages").clone();
  advantages[0][0] = std::numeric_limits<float>::quiet_NaN();
  batch.batch.set("advantages", advantages);
  const auto before = digests(wg);
  DataProto out = wg.call(&ActorRolloutRefWorker::update_actor, batch);
  CHECK(digests(wg) == before);
  for (double g : flat_metric(metrics_of(out), "actor/grad_norm")) CHECK_FALSE(std::isfinite(g));
  // the next finite batch trains normally
  batch.batch.set("advantages", torch::nan_to_num(advantages, 0.0));
  wg.call(&ActorRolloutRefWorker::update_actor, batch);
  const auto after = digests(wg);
  CHECK(after[0] == after[1]);
  CHECK(after[0] != before[0]);
}
