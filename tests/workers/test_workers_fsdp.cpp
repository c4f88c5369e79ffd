// The roles under FSDP (actor_rollout_ref.actor.strategy / fsdp_config): sharded groups of 2
// and 4 in-process workers against one worker, the rollout handoff, dynamic batch sizes and
// the critic.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/fsdp_checkpoint.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>

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

void copy_dir(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::filesystem::copy(from, to,
                        std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
}

std::vector<std::string> digests(WorkerGroup& wg) {
  return wg.call(&ActorRolloutRefWorker::parameter_digest);
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

// The policy of a worker checkpoint (sharded layout or Hugging Face folder) as a model.
models::CausalLM checkpoint_model(const std::filesystem::path& dir) {
  if (!parallel::is_sharded_checkpoint(dir)) return models::load_causal_lm(dir);
  models::CausalLM model(tiny_config());
  models::NamedTensors tensors;
  for (auto& p : parallel::load_sharded_parameters(dir)) tensors.emplace_back(p.name, p.tensor);
  torch::NoGradGuard no_grad;
  models::load_parameters(*model, tensors, dir.string());
  return model;
}

at::Tensor saved_weights(WorkerGroup& wg, const std::string& tag) {
  TempDir dir(tag);
  wg.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{1});
  return flat_parameters(*checkpoint_model(dir.path));
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

TEST_CASE("sharded critic on 2 workers: ranks in sync; with hf_model its checkpoint is also a Hugging Face folder") {
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
  auto with_hf = critic_config(4);  // the shards plus the gathered Hugging Face folder
  with_hf["checkpoint"] = {{"save_contents", {"model", "optimizer", "extra", "hf_model"}}};
  auto saver = critic(2, with_hf);
  saver.call(&CriticWorker::load_checkpoint, [&] {
    TempDir sharded("critic_sharded");  // the default: the sharded layout only
    two.call(&CriticWorker::save_checkpoint, sharded.path.string(), int64_t{1});
    CHECK(parallel::is_sharded_checkpoint(sharded.path));
    CHECK_FALSE(std::filesystem::exists(sharded.path / "model.safetensors"));
    const auto copy = dir.path / "sharded";
    std::filesystem::copy(sharded.path, copy);
    return copy.string();
  }());
  saver.call(&CriticWorker::save_checkpoint, dir.path.string(), int64_t{1});
  CHECK(parallel::is_sharded_checkpoint(dir.path));
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

TEST_CASE("bf16 compute on one worker (replicated engine): actor, reference and critic run in bf16, scores in fp32") {
  Runtime rt;
  hyflow::workers::register_workers();
  const Json bf16_precision = {{"mixed_precision", {{"param_dtype", "bf16"}}}};
  const auto base = actor_rollout_ref_config(4);
  auto fp32 = actor_group(rt, 1, base);
  auto bf16 = actor_group(rt, 1, with_fsdp(base, bf16_precision));
  DataProto gen = fp32.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  for (auto [method, key] : {std::pair{&ActorRolloutRefWorker::compute_log_prob, "old_log_probs"},
                             std::pair{&ActorRolloutRefWorker::compute_ref_log_prob, "ref_log_prob"}}) {
    CAPTURE(key);
    const DataProto out32 = fp32.call(method, gen), out16 = bf16.call(method, gen);
    const auto &a = out32.batch.at(key), &b = out16.batch.at(key);
    CHECK(b.scalar_type() == at::kFloat);
    CHECK_FALSE(torch::equal(a, b));  // bf16 really computes on one worker too
    CHECK(torch::allclose(a, b, 0.05, 0.1));
  }
  const DataProto old = fp32.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  gen.union_with(old.select(std::vector<std::string>{"old_log_probs"}));
  const auto before = digests(bf16);
  const auto norms_fp32 = grad_norms(fp32.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen)));
  const auto norms_bf16 = grad_norms(bf16.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen)));
  REQUIRE(norms_bf16.size() == norms_fp32.size());
  for (size_t i = 0; i < norms_fp32.size(); ++i) CHECK(norms_bf16[i] == Approx(norms_fp32[i]).epsilon(0.05));
  CHECK(digests(bf16) != before);
  // the rollout of the bf16 actor (the engine hands it the compute copies) still generates
  const DataProto regen = bf16.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  CHECK(regen.batch.at("responses").sizes() == gen.batch.at("responses").sizes());

  // the critic's value head starts random: both critics load one saved critic (head included)
  auto critic = [&](const Json& fsdp_config, const std::string& path) {
    auto config = critic_config(4);
    config["model"]["path"] = path;
    config["model"]["fsdp_config"] = fsdp_config;
    WorkerGroup wg(rt, ResourcePool({1}), WorkerSpec{"CriticWorker", {{"config", config}}});
    wg.call(&CriticWorker::init_model);
    return wg;
  };
  TempDir saved("critic_bf16");
  critic(Json::object(), tiny_model_dir().string()).call(&CriticWorker::save_checkpoint, saved.path.string(),
                                                           int64_t{1});
  auto critic_fp32 = critic(Json::object(), saved.path.string());
  auto critic_bf16 = critic(bf16_precision, saved.path.string());
  const DataProto values32 = critic_fp32.call(&CriticWorker::compute_values, gen);
  const DataProto values16 = critic_bf16.call(&CriticWorker::compute_values, gen);
  const auto &v32 = values32.batch.at("values"), &v16 = values16.batch.at("values");
  CHECK(v16.scalar_type() == at::kFloat);
  CHECK_FALSE(torch::equal(v32, v16));
  CHECK(torch::allclose(v32, v16, 0.05, 0.05));
  DataProto batch = gen;  // the bf16 critic's value loss (fp32 values) trains its fp32 masters
  batch.union_with(values16);
  batch.batch.set("returns", v16 + 0.5 * gen.batch.at("response_mask"));
  critic_bf16.call(&CriticWorker::update_critic, batch);
  const DataProto after = critic_bf16.call(&CriticWorker::compute_values, gen);
  CHECK_FALSE(torch::equal(after.batch.at("values"), v16));
}

TEST_CASE("one bf16 worker's checkpoint holds the fp32 masters and resumes them: the next update is identical") {
  Runtime rt;
  const auto config = with_fsdp(actor_rollout_ref_config(4), {{"mixed_precision", {{"param_dtype", "bf16"}}}});
  auto one = actor_group(rt, 1, config);
  const DataProto gen = one.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  one.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen));
  TempDir dir("bf16_one_worker");
  one.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{1});
  REQUIRE(parallel::is_sharded_checkpoint(dir.path));
  bool beyond_bf16 = false;  // the masters, trained in fp32, are not all bf16 numbers
  for (const auto& p : parallel::load_sharded_parameters(dir.path)) {
    CHECK(p.tensor.scalar_type() == at::kFloat);
    beyond_bf16 = beyond_bf16 || !torch::equal(p.tensor, p.tensor.to(at::kBFloat16).to(at::kFloat));
  }
  CHECK(beyond_bf16);
  auto back = actor_group(rt, 1, config);
  back.call(&ActorRolloutRefWorker::load_checkpoint, dir.path.string());
  CHECK(digests(back) == digests(one));
  const auto next = with_advantages(gen, 6);
  CHECK(grad_norms(back.call(&ActorRolloutRefWorker::update_actor, next)) ==
        grad_norms(one.call(&ActorRolloutRefWorker::update_actor, next)));
  CHECK(digests(back) == digests(one));
}

// verl's mixed_precision keys per role (actor_rollout_ref.actor / .ref .fsdp_config, critic.model.fsdp_config)
// in each strategy a worker group reaches (one worker, replicated: the test above). Each role reads its own
// key: a bf16 actor beside an fp32 reference leaves the reference's log-probs fp32's, and the other way round.
TEST_CASE("mixed precision in FULL_SHARD, SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD: actor, reference and critic, "
          "each from its own key") {
  struct Layout {
    const char* name;
    int workers;
    Json fsdp_config;
    const char* reduce_dtype;
  };
  const std::vector<Layout> layouts = {
      {"FULL_SHARD on 2 workers", 2, {{"fsdp_size", -1}}, "fp32"},
      {"SHARD_GRAD_OP on 2 workers", 2, {{"fsdp_size", -1}, {"reshard_after_forward", false}}, "bf16"},
      {"NO_SHARD on 2 workers (fsdp_size 1)", 2, {{"fsdp_size", 1}}, "bf16"},
      {"HYBRID_SHARD on 4 workers (fsdp_size 2)", 4, {{"fsdp_size", 2}}, "fp32"}};
  Runtime rt;
  hyflow::workers::register_workers();
  const auto base = actor_rollout_ref_config(8);
  auto one = actor_group(rt, 1, base);  // fp32, one worker
  DataProto gen = one.call(&ActorRolloutRefWorker::generate_sequences, prompts(8));
  const at::Tensor old32 = DataProto(one.call(&ActorRolloutRefWorker::compute_log_prob, gen)).batch.at("old_log_probs");
  const at::Tensor ref32 =
      DataProto(one.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen)).batch.at("ref_log_prob");
  DataProto batch = gen;
  batch.batch.set("old_log_probs", old32);
  batch = with_advantages(batch);
  // the critics load one saved critic (its value head starts random)
  TempDir saved("critic_mp_layouts");
  auto critic = [&](int ws, const Json& fsdp_config, const std::string& path) {
    auto config = critic_config(8);
    config["model"]["path"] = path;
    config["model"]["fsdp_config"] = fsdp_config;
    WorkerGroup wg(rt, ResourcePool({ws}), WorkerSpec{"CriticWorker", {{"config", config}}});
    wg.call(&CriticWorker::init_model);
    return wg;
  };
  critic(1, Json::object(), tiny_model_dir().string())
      .call(&CriticWorker::save_checkpoint, saved.path.string(), int64_t{1});
  const at::Tensor values32 =
      DataProto(critic(1, Json::object(), saved.path.string()).call(&CriticWorker::compute_values, gen))
          .batch.at("values");

  for (const auto& layout : layouts) {
    SECTION(layout.name) {
      Json precise = layout.fsdp_config, mixed = layout.fsdp_config;
      mixed["mixed_precision"] = {
          {"param_dtype", "bf16"}, {"reduce_dtype", layout.reduce_dtype}, {"buffer_dtype", "fp32"}};
      auto config = base;  // a bf16 actor, an fp32 reference
      config["actor"]["fsdp_config"] = mixed;
      config["ref"]["fsdp_config"] = precise;
      auto bf16_actor = actor_group(rt, layout.workers, config);
      const at::Tensor old = DataProto(bf16_actor.call(&ActorRolloutRefWorker::compute_log_prob, gen))
                                 .batch.at("old_log_probs");
      CHECK(old.scalar_type() == at::kFloat);
      CHECK_FALSE(torch::equal(old, old32));  // bf16 really computes
      CHECK(torch::allclose(old, old32, 0.05, 0.1));
      const at::Tensor ref = DataProto(bf16_actor.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen))
                                 .batch.at("ref_log_prob");
      CHECK(torch::allclose(ref, ref32, 1e-5, 1e-6));  // the reference's own key: fp32
      const auto before = digests(bf16_actor);
      for (double v : grad_norms(bf16_actor.call(&ActorRolloutRefWorker::update_actor, batch))) CHECK(std::isfinite(v));
      const auto after = digests(bf16_actor);
      CHECK(all_same(after));
      CHECK(after != before);

      config["actor"]["fsdp_config"] = precise;  // an fp32 actor, a bf16 reference
      config["ref"]["fsdp_config"] = mixed;
      auto bf16_ref = actor_group(rt, layout.workers, config);
      const at::Tensor old_fp32 = DataProto(bf16_ref.call(&ActorRolloutRefWorker::compute_log_prob, gen))
                                      .batch.at("old_log_probs");
      CHECK(torch::allclose(old_fp32, old32, 1e-5, 1e-6));
      const at::Tensor ref16 = DataProto(bf16_ref.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen))
                                   .batch.at("ref_log_prob");
      CHECK(ref16.scalar_type() == at::kFloat);
      CHECK_FALSE(torch::equal(ref16, ref32));
      CHECK(torch::allclose(ref16, ref32, 0.05, 0.1));

      auto bf16_critic = critic(layout.workers, mixed, saved.path.string());
      const at::Tensor values = DataProto(bf16_critic.call(&CriticWorker::compute_values, gen)).batch.at("values");
      CHECK(values.scalar_type() == at::kFloat);
      CHECK_FALSE(torch::equal(values, values32));
      CHECK(torch::allclose(values, values32, 0.05, 0.05));
      DataProto critic_batch = gen;
      critic_batch.batch.set("values", values);
      critic_batch.batch.set("returns", values + 0.5 * gen.batch.at("response_mask"));
      bf16_critic.call(&CriticWorker::update_critic, critic_batch);
      CHECK(all_same(bf16_critic.call(&CriticWorker::parameter_digest)));
      const at::Tensor trained = DataProto(bf16_critic.call(&CriticWorker::compute_values, gen)).batch.at("values");
      CHECK_FALSE(torch::equal(trained, values));
    }
  }
}

// The float32 masters make a checkpoint independent of the precision it was saved under: a group resumes it
// under another mixed_precision config (docs/parallel.md, "Precision"). fp32 -> bf16 -> fp32 through
// checkpoints, with no training in between, must leave masters, AdamW moments and the lr schedule
// bit-exact: the next fp32 update then equals the uninterrupted run's.
TEST_CASE("a checkpoint resumes under another precision config: fp32 -> bf16 -> fp32 continues bit-exactly") {
  Runtime rt;
  const auto fp32 = actor_rollout_ref_config(4, {{"optim", {{"lr", 1e-2}, {"lr_warmup_steps", 3}}}});
  const auto bf16 = with_fsdp(fp32, {{"mixed_precision", {{"param_dtype", "bf16"}}}});
  for (const int ws : {1, 2}) {
    CAPTURE(ws);
    // two workers: the fp32 group replicates (fsdp_size 1), the bf16 one shards (FULL_SHARD)
    const auto precise = ws == 1 ? fp32 : with_fsdp(fp32, {{"fsdp_size", 1}});
    auto full = actor_group(rt, ws, precise);
    DataProto gen = full.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
    gen.union_with(DataProto(full.call(&ActorRolloutRefWorker::compute_log_prob, gen))
                       .select(std::vector<std::string>{"old_log_probs"}));
    full.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen, 4));
    TempDir fp32_dir("precision_fp32"), bf16_dir("precision_bf16");
    full.call(&ActorRolloutRefWorker::save_checkpoint, fp32_dir.path.string(), int64_t{1});
    REQUIRE_FALSE(parallel::is_sharded_checkpoint(fp32_dir.path));  // the replicated layout

    auto in_bf16 = actor_group(rt, ws, bf16);
    in_bf16.call(&ActorRolloutRefWorker::load_checkpoint, fp32_dir.path.string());
    in_bf16.call(&ActorRolloutRefWorker::save_checkpoint, bf16_dir.path.string(), int64_t{1});
    REQUIRE(parallel::is_sharded_checkpoint(bf16_dir.path));  // the fp32 masters' layout
    CHECK(torch::equal(flat_parameters(*checkpoint_model(bf16_dir.path)),
                       flat_parameters(*checkpoint_model(fp32_dir.path))));
    // the bf16 group trains on from there
    for (double v : grad_norms(in_bf16.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen, 6))))
      CHECK(std::isfinite(v));

    auto back = actor_group(rt, ws, precise);
    back.call(&ActorRolloutRefWorker::load_checkpoint, bf16_dir.path.string());
    CHECK(digests(back) == digests(full));
    const auto next = with_advantages(gen, 9);
    const DataProto mine = back.call(&ActorRolloutRefWorker::update_actor, next);
    const DataProto theirs = full.call(&ActorRolloutRefWorker::update_actor, next);
    CHECK(grad_norms(mine) == grad_norms(theirs));
    CHECK(mine.meta_info.at("metrics").at("actor/lr") == theirs.meta_info.at("metrics").at("actor/lr"));
    CHECK(digests(back) == digests(full));  // the same AdamW moments and steps: the same step
  }
}

TEST_CASE("on CPU workers param_offload and optimizer_offload are a no-op: a sharded actor trains as without") {
  Runtime rt;
  const auto base = actor_rollout_ref_config(4);
  auto plain = actor_group(rt, 2, base);
  auto offload = actor_group(rt, 2, with_fsdp(base, {{"param_offload", true}, {"optimizer_offload", true}}));
  DataProto gen = plain.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  DataProto lp = plain.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  DataProto lp_offload = offload.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  CHECK(torch::equal(lp.batch.at("old_log_probs"), lp_offload.batch.at("old_log_probs")));
  gen.union_with(lp.select(std::vector<std::string>{"old_log_probs"}));
  CHECK(grad_norms(plain.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen))) ==
        grad_norms(offload.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen))));
  CHECK(digests(plain) == digests(offload));
}

// What "resumes" promises at another world size (docs/workers.md): the state a group loads is
// bit-identical to the saved one (parameters, AdamW moments and steps, lr schedule position);
// the next step then equals an uninterrupted run at that world size up to the rounding of the
// gradient reduction (another world size sums in another order): grad norms to 1e-4 relative,
// weights within 1% of the step's update, the lr exactly. At the same world size it is bit-exact.
TEST_CASE("a sharded actor checkpoint saved on 4 workers resumes on 2, on 1 and HYBRID: model and optimizer reshard") {
  Runtime rt;
  const auto base = actor_rollout_ref_config(8, {{"optim", {{"lr", 1e-2}, {"lr_warmup_steps", 3}}}});
  auto one = actor_group(rt, 1, base);
  DataProto gen = one.call(&ActorRolloutRefWorker::generate_sequences, prompts(8));
  DataProto lp = one.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  gen.union_with(lp.select(std::vector<std::string>{"old_log_probs"}));
  const DataProto step1 = with_advantages(gen, 4), step2 = with_advantages(gen, 9);

  auto four = actor_group(rt, 4, base);
  four.call(&ActorRolloutRefWorker::update_actor, step1);
  TempDir dir("resume4");
  four.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{1});
  for (int r = 0; r < 4; ++r) {
    CHECK(std::filesystem::exists(dir.path / ("model_shard_" + std::to_string(r) + "_of_4.bin")));
    CHECK(std::filesystem::exists(dir.path / ("optim_shard_" + std::to_string(r) + "_of_4.bin")));
  }
  CHECK_FALSE(std::filesystem::exists(dir.path / "model.safetensors"));  // no hf_model in save_contents
  CHECK(std::filesystem::exists(dir.path / "tokenizer_config.json"));
  const auto saved_digest = digests(four)[0];
  const auto saved_opt = parallel::load_sharded_optimizer(dir.path);
  CHECK(saved_opt.scheduler_steps == 1);

  // hyflow-model-merger turns the worker checkpoint into a Hugging Face folder of these weights
  TempDir hf("resume4_hf");
  const std::string command = std::string(HYFLOW_MODEL_MERGER) + " merge --backend fsdp --local_dir " +
                              dir.path.string() + " --target_dir " + hf.path.string() + " > /dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  CHECK(parallel::parameter_digest(models::load_causal_lm(hf.path)->parameters()) == saved_digest);

  // same world size: the next step is bit-identical
  DataProto next4 = four.call(&ActorRolloutRefWorker::update_actor, step2);
  {
    auto again = actor_group(rt, 4, base);
    again.call(&ActorRolloutRefWorker::load_checkpoint, dir.path.string());
    DataProto next = again.call(&ActorRolloutRefWorker::update_actor, step2);
    CHECK(grad_norms(next) == grad_norms(next4));
    CHECK(digests(again) == digests(four));
  }

  struct Case {
    const char* name;
    int workers;
    int64_t fsdp_size;
  };
  for (const auto& c : {Case{"2 workers FULL_SHARD", 2, -1}, Case{"1 worker", 1, -1}, Case{"4 workers HYBRID", 4, 2}}) {
    SECTION(c.name) {
      const auto config = with_fsdp(base, {{"fsdp_size", c.fsdp_size}});
      auto resumed = actor_group(rt, c.workers, config);
      resumed.call(&ActorRolloutRefWorker::load_checkpoint, dir.path.string());
      CHECK(digests(resumed)[0] == saved_digest);
      if (c.workers > 1) {  // saved again at this world size: the same full optimizer state, bit for bit
        TempDir again("resaved");
        resumed.call(&ActorRolloutRefWorker::save_checkpoint, again.path.string(), int64_t{1});
        const auto opt = parallel::load_sharded_optimizer(again.path);
        CHECK(opt.scheduler_steps == saved_opt.scheduler_steps);
        REQUIRE(opt.parameters.size() == saved_opt.parameters.size());
        for (size_t i = 0; i < opt.parameters.size(); ++i) {
          CAPTURE(opt.parameters[i].name);
          CHECK(opt.parameters[i].name == saved_opt.parameters[i].name);
          CHECK(opt.parameters[i].state.step == saved_opt.parameters[i].state.step);
          CHECK(torch::equal(opt.parameters[i].state.exp_avg, saved_opt.parameters[i].state.exp_avg));
          CHECK(torch::equal(opt.parameters[i].state.exp_avg_sq, saved_opt.parameters[i].state.exp_avg_sq));
        }
      }
      // the next step against an uninterrupted run at this world size
      auto uninterrupted = actor_group(rt, c.workers, config);
      uninterrupted.call(&ActorRolloutRefWorker::update_actor, step1);
      const auto before = saved_weights(uninterrupted, "before");
      DataProto expected = uninterrupted.call(&ActorRolloutRefWorker::update_actor, step2);
      DataProto got = resumed.call(&ActorRolloutRefWorker::update_actor, step2);
      const auto norms = grad_norms(got), want = grad_norms(expected);
      REQUIRE(norms.size() == want.size());
      for (size_t i = 0; i < norms.size(); ++i) CHECK(norms[i] == Approx(want[i]).epsilon(1e-4));
      CHECK(got.meta_info.at("metrics").at("actor/lr") == expected.meta_info.at("metrics").at("actor/lr"));
      const auto w = saved_weights(resumed, "resumed"), w_ref = saved_weights(uninterrupted, "reference");
      const double update = (w_ref - before).abs().max().item<double>();
      REQUIRE(update > 1e-4);
      CAPTURE(update, (w - w_ref).abs().max().item<double>());
      CHECK((w - w_ref).abs().max().item<double>() < 0.01 * update);
      // the comparison tells: without the optimizer state (load_contents ['model']) the step differs
      auto model_only = config;
      model_only["actor"]["checkpoint"] = {{"load_contents", {"model"}}};
      auto fresh = actor_group(rt, c.workers, model_only);
      fresh.call(&ActorRolloutRefWorker::load_checkpoint, dir.path.string());
      fresh.call(&ActorRolloutRefWorker::update_actor, step2);
      CHECK((saved_weights(fresh, "fresh") - w_ref).abs().max().item<double>() > 0.1 * update);
    }
  }
}

TEST_CASE("a sharded worker checkpoint missing a file or failing a checksum is a FormatError naming the file") {
  Runtime rt;
  const auto base = actor_rollout_ref_config(4);
  auto two = actor_group(rt, 2, base);
  DataProto gen = two.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  DataProto lp = two.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  gen.union_with(lp.select(std::vector<std::string>{"old_log_probs"}));
  two.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen));
  TempDir dir("damaged");
  two.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{1});
  auto one = actor_group(rt, 1, base);
  {
    TempDir copy("damaged_optim");
    copy_dir(dir.path, copy.path);
    std::filesystem::remove(copy.path / "optim_shard_1_of_2.bin");
    CHECK_THROWS_WITH(one.call(&ActorRolloutRefWorker::load_checkpoint, copy.path.string()),
                      Catch::Contains("optim_shard_1_of_2.bin"));
  }
  {
    TempDir copy("damaged_model");
    copy_dir(dir.path, copy.path);
    std::fstream f(copy.path / "model_shard_0_of_2.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(17);
    f.put('\x5a');
    f.close();
    CHECK_THROWS_WITH(one.call(&ActorRolloutRefWorker::load_checkpoint, copy.path.string()),
                      Catch::Contains("model_shard_0_of_2.bin") && Catch::Contains("checksum"));
  }
  // load_contents ['model'] reads only the parameter shards
  auto model_only = base;
  model_only["actor"]["checkpoint"] = {{"load_contents", {"model"}}};
  TempDir copy("model_only");
  copy_dir(dir.path, copy.path);
  std::filesystem::remove(copy.path / "optim_shard_0_of_2.bin");
  auto reader = actor_group(rt, 1, model_only);
  reader.call(&ActorRolloutRefWorker::load_checkpoint, copy.path.string());
  CHECK(digests(reader) == std::vector<std::string>{digests(two)[0]});
}
