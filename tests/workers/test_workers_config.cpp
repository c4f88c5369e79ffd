// Config parsing (verl's keys and defaults, clear errors), micro-batching and the lr
// schedule of the role workers. No runtime: workers are constructed directly.
#include "workers_test_util.hpp"

#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

#include <map>

using namespace hyflow;
using namespace hyflow::workers;
using workers_test::actor_rollout_ref_config;
using workers_test::critic_config;

namespace {
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const hyflow::Error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("actor_rollout_ref config: verl defaults where keys are absent") {
  auto c = parse_actor_rollout_ref_config(Json{{"model", {{"path", "/m"}}}});
  CHECK(c.actor.ppo_mini_batch_size == 256);
  CHECK_FALSE(c.actor.ppo_micro_batch_size_per_gpu.has_value());
  CHECK(c.actor.ppo_epochs == 1);
  CHECK(c.actor.loss.clip_ratio == 0.2);
  CHECK(c.actor.loss.clip_ratio_c == 3.0);
  CHECK(c.actor.loss.loss_agg_mode == "token-mean");
  CHECK(c.actor.kl_loss_type == "low_var_kl");
  CHECK(c.actor.kl_loss_coef == 0.001);
  CHECK(c.actor.grad_clip == 1.0);
  CHECK(c.actor.optim.lr == 1e-6);
  CHECK(c.actor.optim.weight_decay == 0.01);
  CHECK(c.actor.optim.betas == std::array<double, 2>{0.9, 0.999});
  CHECK(c.actor.optim.lr_scheduler_type == "constant");
  CHECK(c.rollout.n == 1);
  CHECK(c.rollout.temperature == 1.0);
  CHECK(c.rollout.top_k == -1);
  CHECK(c.rollout.val_kwargs.temperature == 0.0);
  CHECK(c.rollout.gpu_memory_utilization == 0.5);  // verl's KV pool defaults
  CHECK(c.rollout.max_num_seqs == 1024);
  CHECK(c.rollout.free_cache_engine);
  CHECK_FALSE(c.rollout.kv_cache_bytes.has_value());
  CHECK(c.ref.max_token_len_per_gpu == 16384);
}

TEST_CASE("actor_rollout_ref config: values are read with verl's key names") {
  auto c = parse_actor_rollout_ref_config(actor_rollout_ref_config(8, {{"use_kl_loss", true}, {"kl_loss_type", "k2"}}));
  CHECK(c.actor.ppo_mini_batch_size == 8);
  CHECK(c.actor.ppo_micro_batch_size_per_gpu == 2);
  CHECK(c.actor.use_kl_loss);
  CHECK(c.actor.kl_loss_type == "k2");
  CHECK(c.actor.optim.lr == 1e-2);
  CHECK(c.rollout.response_length == 6);
  CHECK(c.rollout.log_prob.micro_batch_size_per_gpu == 2);
  CHECK(c.ref.micro_batch_size_per_gpu == 3);
  CHECK(c.rollout.seed == 7);
  Json kv = actor_rollout_ref_config();
  kv["rollout"]["gpu_memory_utilization"] = 0.8;
  kv["rollout"]["max_num_seqs"] = 64;
  kv["rollout"]["free_cache_engine"] = false;
  kv["rollout"]["kv_cache_bytes"] = 1 << 20;
  c = parse_actor_rollout_ref_config(kv);
  CHECK(c.rollout.gpu_memory_utilization == 0.8);
  CHECK(c.rollout.max_num_seqs == 64);
  CHECK_FALSE(c.rollout.free_cache_engine);
  CHECK(c.rollout.kv_cache_bytes == 1 << 20);
}

TEST_CASE("rollout.dtype: verl's spellings of float32 and bfloat16; float16 and others are refused by name") {
  CHECK(parse_actor_rollout_ref_config(actor_rollout_ref_config()).rollout.dtype == "float32");
  for (const char* name : {"bfloat16", "bf16", "float32", "fp32", "float"}) {
    auto cfg = actor_rollout_ref_config();
    cfg["rollout"]["dtype"] = name;
    CHECK(parse_actor_rollout_ref_config(cfg).rollout.dtype == name);
  }
  for (const char* name : {"float16", "half", "int8"}) {
    auto cfg = actor_rollout_ref_config();
    cfg["rollout"]["dtype"] = name;
    CHECK_THAT(error_of([&] { parse_actor_rollout_ref_config(cfg); }),
               Catch::Contains("actor_rollout_ref.rollout.dtype") && Catch::Contains(name));
  }
}

TEST_CASE("critic config: verl's critic lr default 1e-5 and forward micro-batch falls back to ppo's") {
  auto c = parse_critic_config(Json{{"model", {{"path", "/m"}}}, {"ppo_micro_batch_size_per_gpu", 4}});
  CHECK(c.optim.lr == 1e-5);
  CHECK(c.cliprange_value == 0.5);
  CHECK(c.forward.micro_batch_size_per_gpu == 4);
  CHECK(c.ppo_max_token_len_per_gpu == 32768);
}

TEST_CASE("strategy and fsdp_config are read for actor, ref and critic (critic.model.fsdp_config) with verl's names") {
  auto d = parse_actor_rollout_ref_config(Json{{"model", {{"path", "/m"}}}});
  CHECK(d.actor.fsdp.strategy == "fsdp");
  CHECK(d.actor.fsdp.fsdp_size == -1);
  CHECK(d.actor.fsdp.reshard_after_forward);
  CHECK(d.actor.fsdp.param_dtype == "fp32");
  auto cfg = actor_rollout_ref_config();
  cfg["actor"]["strategy"] = "fsdp2";
  cfg["actor"]["fsdp_config"] = {{"fsdp_size", 2},
                                 {"param_offload", true},
                                 {"optimizer_offload", true},
                                 {"reshard_after_forward", false},
                                 {"forward_prefetch", false},
                                 {"wrap_policy", {{"min_num_params", 1000}}},
                                 {"mixed_precision", {{"param_dtype", "bf16"}, {"reduce_dtype", "float32"}}}};
  cfg["ref"]["fsdp_config"] = {{"fsdp_size", 1}};
  auto c = parse_actor_rollout_ref_config(cfg);
  CHECK(c.actor.fsdp.strategy == "fsdp2");
  CHECK(c.actor.fsdp.fsdp_size == 2);
  CHECK(c.actor.fsdp.param_offload);
  CHECK(c.actor.fsdp.optimizer_offload);
  CHECK_FALSE(c.actor.fsdp.reshard_after_forward);
  CHECK(c.actor.fsdp.min_num_params == 1000);
  CHECK(c.actor.fsdp.param_dtype == "bf16");
  CHECK(c.actor.fsdp.reduce_dtype == "float32");
  CHECK(c.ref_fsdp.fsdp_size == 1);
  auto critic = critic_config();
  critic["strategy"] = "fsdp";
  critic["model"]["fsdp_config"] = {{"fsdp_size", 4}, {"param_offload", true}};
  auto cc = parse_critic_config(critic);
  CHECK(cc.fsdp.fsdp_size == 4);
  CHECK(cc.fsdp.param_offload);

  auto bad = [&](const char* key, Json value) {
    auto b = actor_rollout_ref_config();
    b["actor"]["fsdp_config"][key] = std::move(value);
    return error_of([&] { parse_actor_rollout_ref_config(b); });
  };
  CHECK_THAT(bad("fsdp_size", 0), Catch::Contains("actor_rollout_ref.actor.fsdp_config.fsdp_size"));
  CHECK_THAT(
      bad("mixed_precision", Json{{"param_dtype", "fp8"}}),
      Catch::Contains("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype") && Catch::Contains("fp8"));
  CHECK_THAT(bad("sharding", 1), Catch::Contains("actor_rollout_ref.actor.fsdp_config.sharding"));
  auto megatron = actor_rollout_ref_config();
  megatron["actor"]["strategy"] = "megatron";
  CHECK_THAT(error_of([&] { parse_actor_rollout_ref_config(megatron); }),
             Catch::Contains("actor_rollout_ref.actor.strategy") && Catch::Contains("megatron"));
}

TEST_CASE("unknown config keys are errors naming the full key path") {
  auto cfg = actor_rollout_ref_config();
  cfg["actor"]["ppo_epoch"] = 2;  // typo of ppo_epochs
  CHECK_THROWS_AS(parse_actor_rollout_ref_config(cfg), KeyError);
  CHECK_THAT(error_of([&] { parse_actor_rollout_ref_config(cfg); }),
             Catch::Contains("actor_rollout_ref.actor.ppo_epoch'"));
  auto optim = actor_rollout_ref_config();
  optim["actor"]["optim"]["learning_rate"] = 1.0;
  CHECK_THAT(error_of([&] { parse_actor_rollout_ref_config(optim); }),
             Catch::Contains("actor_rollout_ref.actor.optim.learning_rate"));
  auto critic = critic_config();
  critic["vf_coef"] = 1.0;
  CHECK_THAT(error_of([&] { parse_critic_config(critic); }), Catch::Contains("critic.vf_coef"));
  CHECK_THAT(error_of([] {
               parse_reward_model_config(Json{{"model", {{"path", "/m"}}}, {"bogus", 1}});
             }),
             Catch::Contains("reward_model.bogus"));
}

TEST_CASE("bad config values are ValueErrors naming the key and the value") {
  auto with = [](const char* section, const char* key, Json value) {
    auto cfg = actor_rollout_ref_config();
    cfg[section][key] = std::move(value);
    return error_of([&] { parse_actor_rollout_ref_config(cfg); });
  };
  CHECK_THAT(with("actor", "ppo_epochs", 0),
             Catch::Contains("actor_rollout_ref.actor.ppo_epochs") && Catch::Contains(">= 1"));
  CHECK_THAT(with("actor", "ppo_epochs", "two"), Catch::Contains("must be an integer") && Catch::Contains("\"two\""));
  CHECK_THAT(with("actor", "loss_agg_mode", "mean"), Catch::Contains("actor_rollout_ref.actor.loss_agg_mode"));
  CHECK_THAT(with("actor", "clip_ratio_c", 1.0), Catch::Contains("clip_ratio_c"));
  CHECK_THAT(with("actor", "policy_loss", Json{{"loss_mode", "nope"}}), Catch::Contains("policy_loss.loss_mode"));
  CHECK_THAT(with("actor", "ulysses_sequence_parallel_size", 2), Catch::Contains("ulysses_sequence_parallel_size"));
  CHECK_THAT(with("rollout", "top_p", 1.5), Catch::Contains("actor_rollout_ref.rollout.top_p"));
  CHECK_THAT(with("rollout", "n", -1), Catch::Contains("actor_rollout_ref.rollout.n"));
  CHECK_THAT(with("rollout", "gpu_memory_utilization", 1.5),
             Catch::Contains("actor_rollout_ref.rollout.gpu_memory_utilization") && Catch::Contains("(0, 1]"));
  CHECK_THAT(with("rollout", "max_num_seqs", 0), Catch::Contains("actor_rollout_ref.rollout.max_num_seqs"));
  CHECK_THAT(with("rollout", "kv_cache_bytes", 0), Catch::Contains("actor_rollout_ref.rollout.kv_cache_bytes"));
  CHECK_THAT(with("model", "path", ""), Catch::Contains("actor_rollout_ref.model.path"));
  CHECK_THAT(with("model", "lora_rank", -1), Catch::Contains("actor_rollout_ref.model.lora_rank"));
  CHECK_THAT(with("model", "target_modules", 3), Catch::Contains("actor_rollout_ref.model.target_modules"));
  CHECK_THAT(with("model", "lora_adapter_path", "/a"), Catch::Contains("actor_rollout_ref.model.lora_adapter_path"));
  auto kl = actor_rollout_ref_config(4, {{"use_kl_loss", true}, {"kl_loss_type", "k9"}});
  CHECK_THAT(error_of([&] { parse_actor_rollout_ref_config(kl); }), Catch::Contains("kl_loss_type"));
  auto cosine = actor_rollout_ref_config(4, {{"optim", {{"lr_scheduler_type", "cosine"}}}});
  CHECK_THAT(error_of([&] { parse_actor_rollout_ref_config(cosine); }), Catch::Contains("total_training_steps"));
  auto sched = actor_rollout_ref_config(4, {{"optim", {{"lr_scheduler_type", "linear"}}}});
  CHECK_THAT(error_of([&] { parse_actor_rollout_ref_config(sched); }), Catch::Contains("lr_scheduler_type"));
}

TEST_CASE("worker init args: unknown role, missing role and stray args are refused") {
  const auto cfg = actor_rollout_ref_config();
  CHECK_THAT(error_of([&] {
               ActorRolloutRefWorker(Json{{"config", cfg}, {"role", "critic"}});
             }),
             Catch::Contains("unknown ActorRolloutRefWorker role 'critic'"));
  CHECK_THROWS_AS(ActorRolloutRefWorker(Json{{"config", cfg}}), KeyError);
  CHECK_THROWS_AS(ActorRolloutRefWorker(Json{{"config", cfg}, {"role", "actor"}, {"extra", 1}}), KeyError);
  CHECK_THROWS_AS(CriticWorker(Json{{"cfg", critic_config()}}), KeyError);
  ActorRolloutRefWorker ok(Json{{"config", cfg}, {"role", "actor_rollout_ref"}});
  CHECK(ok.role() == Role::actor_rollout_ref);
  CHECK_THROWS_WITH(ok.compute_log_prob(workers_test::prompts(2)), Catch::Contains("init_model"));
}

TEST_CASE("mini-batch normalization: x rollout.n, / world size; must divide and fit micro-batches") {
  CHECK(normalized_mini_batch_size(4, 2, 2, 2, "p") == 4);
  CHECK(normalized_mini_batch_size(256, 1, 1, std::nullopt, "p") == 256);
  CHECK_THAT(error_of([] { normalized_mini_batch_size(3, 1, 2, std::nullopt, "actor.ppo_mini_batch_size"); }),
             Catch::Contains("actor.ppo_mini_batch_size") && Catch::Contains("2 workers"));
  CHECK_THAT(error_of([] { normalized_mini_batch_size(6, 1, 1, 4, "p"); }), Catch::Contains("micro-batch size 4"));
}

TEST_CASE("fixed micro-batches of 10 rows by 4 are 4,4,2 in order") {
  auto data = workers_test::prompts(10);
  auto mb = make_micro_batches(data, ForwardBatching{.micro_batch_size_per_gpu = 4}, "t");
  REQUIRE(mb.batches.size() == 3);
  CHECK(mb.batches[0].size() == 4);
  CHECK(mb.batches[2].size() == 2);
  CHECK(mb.order.empty());
  CHECK(make_micro_batches(data, ForwardBatching{}, "t").batches.size() == 1);
}

TEST_CASE("dynamic micro-batches: ceil(tokens / max) groups balanced by tokens, order restores rows") {
  auto data = workers_test::prompts(8);  // 5,4,3,2,5,4,3,2 tokens = 28
  auto mb = make_micro_batches(data, ForwardBatching{.use_dynamic_bsz = true, .max_token_len_per_gpu = 10}, "t");
  REQUIRE(mb.batches.size() == 3);
  int64_t rows = 0;
  for (const auto& b : mb.batches) {
    rows += b.size();
    CHECK(b.batch.at("attention_mask").sum().item<int64_t>() <= 10);
  }
  CHECK(rows == 8);
  auto joined = DataProto::concat(mb.batches);
  auto restored = restore_order(joined, mb.order);
  CHECK(torch::equal(restored.batch.at("input_ids"), data.batch.at("input_ids")));
  CHECK_THAT(error_of([&] {
               make_micro_batches(data, ForwardBatching{.use_dynamic_bsz = true, .max_token_len_per_gpu = 4},
                                  "compute_log_prob");
             }),
             Catch::Contains("compute_log_prob") && Catch::Contains("5 tokens"));
}

TEST_CASE("optimizer: warmup schedule from lr_warmup_steps_ratio and the logged lr before each step") {
  auto p = torch::zeros({3}, torch::requires_grad());
  OptimConfig o;
  o.lr = 1.0;
  o.lr_warmup_steps_ratio = 0.5;
  o.total_training_steps = 4;  // warmup 2 steps: lr 0, 0.5, then 1
  parallel::DataParallelOptimizer opt({p}, o, nullptr, "actor.optim");
  CHECK(opt.lr() == Approx(0.0));
  opt.scheduler_step();
  CHECK(opt.lr() == Approx(0.5));
  opt.scheduler_step();
  CHECK(opt.lr() == Approx(1.0));
  OptimConfig missing_total;
  missing_total.lr_warmup_steps_ratio = 0.1;
  CHECK_THAT(error_of([&] { parallel::DataParallelOptimizer({p}, missing_total, nullptr, "actor.optim"); }),
             Catch::Contains("actor.optim.lr_warmup_steps_ratio"));
}

TEST_CASE("optimizer: a non-finite gradient norm skips the step and zeroes the gradients") {
  auto p = torch::ones({2}, torch::requires_grad());
  OptimConfig o;
  o.lr = 0.1;
  o.lr_warmup_steps = 0;
  parallel::DataParallelOptimizer opt({p}, o, nullptr, "optim");
  p.mutable_grad() = torch::tensor({std::numeric_limits<float>::infinity(), 1.0f});
  const double norm = opt.step(1.0);
  CHECK_FALSE(std::isfinite(norm));
  CHECK(torch::equal(p.detach(), torch::ones({2})));
  CHECK(p.grad().abs().sum().item<double>() == 0.0);
  p.mutable_grad() = torch::tensor({3.0f, 4.0f});
  CHECK(opt.step(1.0) == Approx(5.0));
  CHECK(p.detach()[0].item<double>() < 1.0);
}

TEST_CASE("optimizer state and schedule position survive save and load") {
  auto a = torch::ones({4}, torch::requires_grad());
  auto b = torch::ones({4}, torch::requires_grad());
  OptimConfig o;
  o.lr = 0.1;
  o.lr_warmup_steps = 3;
  parallel::DataParallelOptimizer first({a}, o, nullptr, "optim"), second({b}, o, nullptr, "optim");
  for (int i = 0; i < 2; ++i) {
    first.scheduler_step();
    a.mutable_grad() = torch::full({4}, 0.5f);
    first.step(10.0);
  }
  workers_test::TempDir dir("optim");
  first.save(dir.path / "optim.pt");
  second.load(dir.path / "optim.pt");
  {
    torch::NoGradGuard g;
    b.copy_(a);
  }
  CHECK(second.scheduler_steps() == 2);
  CHECK(second.lr() == Approx(first.lr()));
  a.mutable_grad() = torch::full({4}, -0.25f);
  b.mutable_grad() = torch::full({4}, -0.25f);
  first.step(10.0);
  second.step(10.0);
  CHECK(torch::equal(a.detach(), b.detach()));
  CHECK_THROWS_AS(second.load(dir.path / "missing.pt"), FormatError);
}

TEST_CASE("optimizer: cosine schedule with warmup decays to min_lr_ratio at total_training_steps") {
  auto p = torch::zeros({1}, torch::requires_grad());
  OptimConfig o;
  o.lr = 2.0;
  o.lr_scheduler_type = "cosine";
  o.lr_warmup_steps = 2;
  o.total_training_steps = 6;
  o.min_lr_ratio = 0.1;
  parallel::DataParallelOptimizer opt({p}, o, nullptr, "optim");
  std::vector<double> lrs;
  for (int i = 0; i <= 6; ++i) {
    lrs.push_back(opt.lr());
    opt.scheduler_step();
  }
  CHECK(lrs[0] == Approx(0.0));
  CHECK(lrs[1] == Approx(1.0));
  CHECK(lrs[2] == Approx(2.0));
  // halfway through the decay: (1 + min) / 2
  CHECK(lrs[4] == Approx(2.0 * 0.55));
  CHECK(lrs[6] == Approx(2.0 * 0.1));
}

TEST_CASE("LoRA keys: verl's lora_rank, lora_alpha, target_modules (string or list), exclude_modules") {
  auto cfg = actor_rollout_ref_config();
  auto plain = parse_actor_rollout_ref_config(cfg);
  CHECK(plain.model.lora.rank == 0);
  CHECK(plain.model.lora.target_modules == std::vector<std::string>{"all-linear"});
  cfg["model"]["lora_rank"] = 8;
  cfg["model"]["lora_alpha"] = 32;
  cfg["model"]["target_modules"] = Json::array({"q_proj", "v_proj"});
  cfg["model"]["exclude_modules"] = "model.layers.0.self_attn.q_proj";
  auto lora = parse_actor_rollout_ref_config(cfg).model.lora;
  CHECK(lora.rank == 8);
  CHECK(lora.alpha == 32.0);
  CHECK(lora.target_modules == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(lora.exclude_modules == std::vector<std::string>{"model.layers.0.self_attn.q_proj"});
  Json critic = {{"model", {{"path", "/m"}, {"lora_rank", 4}, {"target_modules", "all-linear"}}}};
  CHECK(parse_critic_config(critic).model.lora.rank == 4);
  critic["model"]["lora_alpha"] = 0;
  CHECK_THAT(error_of([&] { parse_critic_config(critic); }), Catch::Contains("critic.model.lora_alpha"));
}

TEST_CASE("verl's multi_turn and agent keys are in the key table and type-checked") {
  std::map<std::string, ConfigKey> keys;
  for (auto& k : worker_config_keys()) keys.emplace(k.name, k);
  const std::string mt = "actor_rollout_ref.rollout.multi_turn.";
  for (const char* key : {"enable", "max_assistant_turns", "max_user_turns", "max_parallel_calls",
                          "max_tool_response_length", "tool_response_truncate_side", "tool_config_path",
                          "interaction_config_path", "format"})
    CHECK(keys.count(mt + key) == 1);
  CHECK(keys.at(mt + "enable").default_value == false);
  CHECK(keys.at(mt + "max_parallel_calls").default_value == 1);
  CHECK(keys.at(mt + "max_assistant_turns").nullable);
  CHECK(keys.count("actor_rollout_ref.rollout.agent.num_workers") == 1);
  auto cfg = actor_rollout_ref_config();
  cfg["rollout"]["multi_turn"] = {{"enable", true}, {"max_turns", 3}};
  CHECK_THAT(error_of([&] { parse_actor_rollout_ref_config(cfg); }),
             Catch::Contains("actor_rollout_ref.rollout.multi_turn.max_turns"));
  cfg["rollout"]["multi_turn"] = {{"max_parallel_calls", "two"}};
  CHECK_THAT(error_of([&] { parse_actor_rollout_ref_config(cfg); }),
             Catch::Contains("actor_rollout_ref.rollout.multi_turn.max_parallel_calls"));
}
