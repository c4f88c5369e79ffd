// CriticWorker and RewardModelWorker: colocated with the actor role in one worker (spawn),
// value updates in sync across ranks, data-parallel equivalence, checkpoints and rm scores.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using hyflow::workers::CriticWorker;
using hyflow::workers::RewardModelWorker;
using namespace workers_test;

namespace {
WorkerGroup critic_group(Runtime& rt, int ws, Json config = critic_config()) {
  hyflow::workers::register_workers();
  WorkerGroup wg(rt, ResourcePool({ws}), WorkerSpec{"CriticWorker", {{"config", std::move(config)}}});
  wg.call(&CriticWorker::init_model);
  return wg;
}

std::vector<std::string> critic_digests(WorkerGroup& wg) { return wg.call(&CriticWorker::parameter_digest); }
}  // namespace

TEST_CASE("colocated actor_rollout_ref + critic on 1 and 2 workers: spawn, values, both updates, ranks in sync") {
  Runtime rt;
  hyflow::workers::register_workers();
  for (int ws : {1, 2}) {
    CAPTURE(ws);
    auto spec = colocated_spec(
        {{"actor_rollout_ref",
          {"ActorRolloutRefWorker", {{"config", actor_rollout_ref_config(4)}, {"role", "actor_rollout_ref"}}}},
         {"critic", {"CriticWorker", {{"config", critic_config(4)}}}}});
    WorkerGroup bundle(rt, ResourcePool({ws}), spec);
    auto views = bundle.spawn({"actor_rollout_ref", "critic"});
    auto& actor = views.at("actor_rollout_ref");
    auto& critic = views.at("critic");
    actor.call(&ActorRolloutRefWorker::init_model);
    critic.call(&CriticWorker::init_model);

    DataProto gen = actor.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
    DataProto values = critic.call(&CriticWorker::compute_values, gen);
    REQUIRE(values.batch.at("values").sizes() == at::IntArrayRef({4, 6}));
    const auto off = gen.batch.at("response_mask") == 0;
    CHECK(values.batch.at("values").masked_select(off).abs().sum().item<double>() == 0.0);

    DataProto lp = actor.call(&ActorRolloutRefWorker::compute_log_prob, gen);
    gen.union_with(lp.select(std::vector<std::string>{"old_log_probs"}));
    gen.union_with(values);
    auto returns = values.batch.at("values") + 1.0 * gen.batch.at("response_mask");
    gen.batch.set("returns", returns);
    DataProto cm = critic.call(&CriticWorker::update_critic, gen);
    const Json& metrics = cm.meta_info.at("metrics");
    for (const char* name :
         {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"}) {
      CAPTURE(name);
      REQUIRE(metrics.contains(name));
      for (const auto& v : metrics.at(name).flatten()) CHECK(std::isfinite(v.get<double>()));
    }
    const Json& first = metrics.at("critic/vf_loss").at(0);
    CHECK((first.is_number() ? first : first.at(0)).get<double>() > 0);
    actor.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen));
    std::vector<std::string> cd = critic.call(&CriticWorker::parameter_digest);
    std::vector<std::string> ad = actor.call(&ActorRolloutRefWorker::parameter_digest);
    CHECK(cd.front() == cd.back());
    CHECK(ad.front() == ad.back());
    // after a step toward returns = values + 1 the values rise
    DataProto values_after = critic.call(&CriticWorker::compute_values, gen);
    const auto on = gen.batch.at("response_mask").to(torch::kBool);
    CHECK(values_after.batch.at("values").masked_select(on).mean().item<double>() >
          values.batch.at("values").masked_select(on).mean().item<double>());
  }
}

TEST_CASE("critic data parallel: 2 workers update like 1 worker; checkpoint load makes the next update identical") {
  Runtime rt;
  hyflow::workers::register_workers();
  auto config = critic_config(8);
  config["ppo_epochs"] = 2;
  auto one = critic_group(rt, 1, config);
  auto two = critic_group(rt, 2, config);
  // a fresh value head is drawn per group: start both from group one's weights
  TempDir start("critic_start");
  one.call(&CriticWorker::save_checkpoint, start.path.string(), int64_t{0});
  auto batch = critic_batch(8);
  {
    DataProto v = one.call(&CriticWorker::compute_values, batch);
    batch.union_with(v);
  }
  // group two cannot load a world-size-1 checkpoint's optimizer; copy the weights through a
  // world-size-2 save of its own after loading the model tensors
  CHECK_THROWS_WITH(two.call(&CriticWorker::load_checkpoint, start.path.string()), Catch::Contains("this group has 2"));
  auto fresh_two = critic_group(rt, 2, [&] {
    auto c = config;
    c["model"]["path"] = start.path.string();  // an HF directory with the score head
    // sharded by default: also write the gathered Hugging Face folder, read below
    c["checkpoint"] = {{"save_contents", {"model", "optimizer", "extra", "hf_model"}}};
    return c;
  }());
  DataProto m1 = one.call(&CriticWorker::update_critic, batch);
  DataProto m2 = fresh_two.call(&CriticWorker::update_critic, batch);
  // the averaged gradient has the single worker's norm (a sum would double it), per epoch
  const auto g1 = m1.meta_info.at("metrics").at("critic/grad_norm").flatten();
  const auto g2 = m2.meta_info.at("metrics").at("critic/grad_norm").flatten();
  REQUIRE(g1.size() == 2);
  REQUIRE(g2.size() == 4);
  std::vector<double> n1, n2;
  for (const auto& v : g1) n1.push_back(v.get<double>());
  for (const auto& v : g2) n2.push_back(v.get<double>());
  for (size_t i = 0; i < n2.size(); ++i) CHECK(n2[i] == Approx(n1[i % 2]).epsilon(1e-4));
  CHECK(critic_digests(fresh_two)[0] == critic_digests(fresh_two)[1]);
  TempDir d1("critic1"), d2("critic2");
  one.call(&CriticWorker::save_checkpoint, d1.path.string(), int64_t{1});
  fresh_two.call(&CriticWorker::save_checkpoint, d2.path.string(), int64_t{1});
  auto w1 = flat_parameters(*models::load_value_model(d1.path));
  auto w2 = flat_parameters(*models::load_value_model(d2.path));
  auto w0 = flat_parameters(*models::load_value_model(start.path));
  CHECK((w1 - w0).abs().max().item<double>() > 1e-4);
  // Adam turns float-rounding noise in near-zero gradients into lr-sized steps, so compare
  // against the size of the update: a wrong reduction (sum, or none) differs by the update.
  const double update = (w1 - w0).abs().max().item<double>();
  CAPTURE(update, (w1 - w2).abs().max().item<double>());
  CHECK((w1 - w2).abs().max().item<double>() < 0.01 * update);

  // resume: a new world-size-2 group loads d2 and repeats the next update bit for bit
  DataProto next_a = fresh_two.call(&CriticWorker::update_critic, batch);
  auto resumed = critic_group(rt, 2, config);
  resumed.call(&CriticWorker::load_checkpoint, d2.path.string());
  DataProto next_b = resumed.call(&CriticWorker::update_critic, batch);
  CHECK(critic_digests(resumed) == critic_digests(fresh_two));
  CHECK(next_a.meta_info.at("metrics").at("critic/vf_loss") == next_b.meta_info.at("metrics").at("critic/vf_loss"));
}

TEST_CASE("critic update names missing inputs") {
  Runtime rt;
  hyflow::workers::register_workers();
  auto wg = critic_group(rt, 1);
  auto batch = critic_batch(4);
  CHECK_THROWS_WITH(wg.call(&CriticWorker::update_critic, batch),
                    Catch::Contains("update_critic") && Catch::Contains("'values'"));
}

TEST_CASE("reward model: the score of the last valid token sits at valid response length - 1, zeros elsewhere") {
  Runtime rt;
  hyflow::workers::register_workers();
  // an rm checkpoint with its own score head
  TempDir rm_dir("rm");
  torch::manual_seed(77);
  models::ValueModel reference(tiny_config());
  models::save_pretrained(*reference, tiny_config(), rm_dir.path);
  reference->eval();

  for (int ws : {1, 2}) {
    CAPTURE(ws);
    WorkerGroup wg(
        rt, ResourcePool({ws}),
        WorkerSpec{"RewardModelWorker",
                   {{"config", {{"model", {{"path", rm_dir.path.string()}}}, {"micro_batch_size_per_gpu", 2}}}}});
    wg.call(&RewardModelWorker::init_model);
    auto batch = critic_batch(6);
    DataProto out = wg.call(&RewardModelWorker::compute_rm_score, batch);
    const auto& scores = out.batch.at("rm_scores");
    REQUIRE(scores.sizes() == at::IntArrayRef({6, 6}));
    torch::NoGradGuard g;
    auto full =
        reference(batch.batch.at("input_ids"), batch.batch.at("attention_mask"), batch.batch.at("position_ids"));
    const auto valid = batch.batch.at("response_mask").sum(-1);
    for (int64_t r = 0; r < 6; ++r) {
      const int64_t at_pos = valid[r].item<int64_t>() - 1;
      const int64_t seq_pos = 5 + at_pos;
      CHECK(scores[r][at_pos].item<double>() == Approx(full[r][seq_pos].item<double>()).margin(1e-5));
      CHECK(scores[r].abs().sum().item<double>() == Approx(std::abs(scores[r][at_pos].item<double>())).margin(1e-6));
    }
  }
}
