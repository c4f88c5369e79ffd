// LoRA through ActorRolloutRefWorker and CriticWorker: the reference from the same model with adapters
// disabled, a frozen base, the rollout serving the merged adapters, adapter-only weight sync and
// PEFT checkpoints.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/lora.hpp>
#include <hyflow/models/safetensors.hpp>
#include <hyflow/parallel/fsdp_checkpoint.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <optional>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using hyflow::workers::CriticWorker;
using namespace workers_test;
namespace fs = std::filesystem;

namespace {
WorkerGroup group(Runtime& rt, int ws, const std::string& role, const Json& config) {
  hyflow::workers::register_workers();
  WorkerGroup wg(rt, ResourcePool({ws}), WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", role}}});
  wg.call(&ActorRolloutRefWorker::init_model);
  return wg;
}

Json lora_config(const fs::path& model = tiny_model_dir()) {
  auto c = actor_rollout_ref_config(4, {{"optim", {{"lr", 5e-2}, {"weight_decay", 0.0}, {"lr_warmup_steps", 0}}},
                                        {"fsdp_config", {{"fsdp_size", 1}}}});
  c["model"]["path"] = model.string();
  c["model"]["lora_rank"] = 4;
  c["model"]["lora_alpha"] = 16;
  c["model"]["target_modules"] = "all-linear";
  return c;
}

DataProto greedy(DataProto p, int64_t length = 6) {
  p.meta_info["validate"] = true;
  p.meta_info["response_length"] = length;
  return p;
}

DataProto train_once(WorkerGroup& actor, uint64_t seed = 3) {
  DataProto gen = actor.call(&ActorRolloutRefWorker::generate_sequences, prompts(4, 5, seed));
  gen.union_with(DataProto(actor.call(&ActorRolloutRefWorker::compute_log_prob, gen))
                     .select(std::vector<std::string>{"old_log_probs"}));
  actor.call(&ActorRolloutRefWorker::update_actor, with_advantages(gen, seed + 1));
  return gen;
}

// The merged model of a LoRA checkpoint written as a plain Hugging Face folder.
void write_merged(const fs::path& adapter, const fs::path& out) {
  auto model = models::load_causal_lm(tiny_model_dir());
  models::apply_adapter(*model, adapter, tiny_model_dir().string());
  models::CausalLM plain(model->config());
  models::load_parameters(*plain, models::merged_parameters(*model), "merged");
  models::save_pretrained(*plain, plain->config(), out);
}
}  // namespace

TEST_CASE("LoRA actor: reference = the separately loaded base bit for bit, base frozen through updates; "
          "replicated and FULL_SHARD") {
  Runtime rt;
  auto plain = group(rt, 1, "actor_rollout_ref", actor_rollout_ref_config(4));
  DataProto gen = plain.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
  const DataProto base_ref = plain.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen);
  // one batch for every layout (the LoRA policy starts as the base: the base's log-probs are its own)
  DataProto batch = gen;
  batch.union_with(DataProto(plain.call(&ActorRolloutRefWorker::compute_log_prob, gen))
                       .select(std::vector<std::string>{"old_log_probs"}));
  batch = with_advantages(batch);
  std::optional<at::Tensor> replicated_policy;
  double replicated_norm = 0;
  for (auto [ws, fsdp_size] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{2, -1}}) {
    CAPTURE(ws, fsdp_size);
    auto config = lora_config();
    config["actor"]["fsdp_config"]["fsdp_size"] = fsdp_size;
    auto lora = group(rt, ws, "actor_rollout_ref", config);
    std::vector<double> norms;  // the adapters' gradient norm of each update, as rank 0 reports it
    for (int step = 0; step < 3; ++step) {
      const DataProto out = lora.call(&ActorRolloutRefWorker::update_actor, batch);
      const Json& g = out.meta_info.at("metrics").at("actor/grad_norm");
      norms.push_back(g.front().is_number() ? g.front().get<double>() : g.front().front().get<double>());
    }
    const DataProto ref = lora.call(&ActorRolloutRefWorker::compute_ref_log_prob, gen);
    CHECK(torch::equal(ref.batch.at("ref_log_prob"), base_ref.batch.at("ref_log_prob")));
    const DataProto policy = lora.call(&ActorRolloutRefWorker::compute_log_prob, gen);
    const auto lp = policy.batch.at("old_log_probs");
    CHECK_FALSE(torch::allclose(lp, base_ref.batch.at("ref_log_prob")));
    // the same training on every layout (the sharded engine reduces and steps the adapters only): the
    // first gradient norm agrees; later steps agree up to Adam's amplified rounding noise, so the
    // policies are compared against the size of the change
    if (!replicated_policy) {
      replicated_policy = lp;
      replicated_norm = norms.front();
    }
    CHECK(norms.front() == Approx(replicated_norm).epsilon(1e-4));
    const double moved = (*replicated_policy - base_ref.batch.at("ref_log_prob")).abs().max().item<double>();
    CAPTURE(moved, (lp - *replicated_policy).abs().max().item<double>());
    CHECK((lp - *replicated_policy).abs().max().item<double>() < 0.05 * moved);
    if (fsdp_size == -1) {  // a sharded LoRA checkpoint resumes, and carries the PEFT folder
      TempDir dir("lora_sharded");
      lora.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{3});
      CHECK(fs::exists(dir.path / "lora_adapter" / "adapter_model.safetensors"));
      auto resumed = group(rt, ws, "actor_rollout_ref", config);
      resumed.call(&ActorRolloutRefWorker::load_checkpoint, dir.path.string());
      const DataProto again = resumed.call(&ActorRolloutRefWorker::compute_log_prob, gen);
      CHECK(torch::equal(again.batch.at("old_log_probs"), lp));
      const DataProto greedy_a = lora.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(8)));
      const DataProto greedy_b = resumed.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(8)));
      CHECK(torch::equal(greedy_a.batch.at("responses"), greedy_b.batch.at("responses")));
    }
  }
}

TEST_CASE("LoRA actor: the rollout serves base + adapter; checkpoints are PEFT folders that resume") {
  Runtime rt;
  auto actor = group(rt, 1, "actor_rollout_ref", lora_config());
  for (int step = 0; step < 3; ++step) train_once(actor, 3 + static_cast<uint64_t>(step));
  TempDir dir("lora_ckpt");
  actor.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{3});
  const auto adapter = dir.path / "lora_adapter";
  CHECK(fs::exists(adapter / "adapter_config.json"));
  CHECK(fs::exists(adapter / "adapter_model.safetensors"));
  CHECK_FALSE(fs::exists(dir.path / "model.safetensors"));  // no copy of the frozen base
  CHECK(models::read_adapter_config(adapter).base_model_name_or_path == tiny_model_dir().string());

  // greedy rollouts of the LoRA actor = those of a plain actor on the merged weights
  TempDir merged("lora_merged");
  write_merged(adapter, merged.path);
  std::ofstream(merged.path / "tokenizer_config.json") << R"({"tokenizer_class": "hyflow-char"})";
  auto on_merged = group(rt, 1, "actor_rollout_ref", actor_rollout_ref_config(4));
  auto base = group(rt, 1, "actor_rollout_ref", actor_rollout_ref_config(4));
  auto merged_config = actor_rollout_ref_config(4);
  merged_config["model"]["path"] = merged.path.string();
  auto plain_merged = group(rt, 1, "actor_rollout_ref", merged_config);
  const DataProto mine = actor.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(8)));
  const DataProto theirs = plain_merged.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(8)));
  const DataProto initial = base.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(8)));
  CHECK(torch::equal(mine.batch.at("responses"), theirs.batch.at("responses")));
  CHECK_FALSE(torch::equal(mine.batch.at("responses"), initial.batch.at("responses")));  // not the initial policy

  // resume: a fresh LoRA actor loading the checkpoint generates the same
  auto resumed = group(rt, 1, "actor_rollout_ref", lora_config());
  resumed.call(&ActorRolloutRefWorker::load_checkpoint, dir.path.string());
  const DataProto again = resumed.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(8)));
  CHECK(torch::equal(again.batch.at("responses"), mine.batch.at("responses")));
  CHECK(std::vector<std::string>(actor.call(&ActorRolloutRefWorker::parameter_digest)) ==
        std::vector<std::string>(resumed.call(&ActorRolloutRefWorker::parameter_digest)));

  // another target set refuses the checkpoint, naming the mismatch
  auto other_config = lora_config();
  other_config["model"]["target_modules"] = Json::array({"q_proj"});
  auto other = group(rt, 1, "actor_rollout_ref", other_config);
  CHECK_THROWS_WITH(other.call(&ActorRolloutRefWorker::load_checkpoint, dir.path.string()),
                    Catch::Contains("target_modules") && Catch::Contains("only in the adapter"));
}

TEST_CASE("LoRA weight sync: only the adapters travel (bytes reported); the rollout group then matches the trainer") {
  Runtime rt;
  auto actor = group(rt, 1, "actor_rollout_ref", lora_config());
  auto rollout = group(rt, 1, "rollout", lora_config());
  for (int step = 0; step < 2; ++step) train_once(actor, 3 + static_cast<uint64_t>(step));
  const Value parts = actor.call(&ActorRolloutRefWorker::export_weights);
  DataProto weights = parts.list().front().dataproto();
  weights.meta_info["weight_version"] = 2;
  int64_t adapter_bytes = 0;
  for (const auto& [name, t] : weights.batch) {
    CHECK(name.find(".lora_") != std::string::npos);
    adapter_bytes += t.numel() * t.element_size();
  }
  CHECK(weights.meta_info.at("sync_bytes").get<int64_t>() == adapter_bytes);
  CHECK(weights.meta_info.at("lora") == true);
  const auto full_bytes = tiny_config().num_parameters() * 4;
  CHECK(adapter_bytes < full_bytes / 2);

  rollout.call(&ActorRolloutRefWorker::load_weights, weights);
  CHECK(std::vector<int64_t>(rollout.call(&ActorRolloutRefWorker::weight_version)) == std::vector<int64_t>{2});
  const DataProto mine = rollout.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(8)));
  const DataProto theirs = actor.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(8)));
  CHECK(torch::equal(mine.batch.at("responses"), theirs.batch.at("responses")));

  // full weights into a LoRA rollout group, adapters into a full one: refused, naming lora_rank
  auto full_actor = group(rt, 1, "actor_rollout_ref", actor_rollout_ref_config(4));
  const Value full_parts = full_actor.call(&ActorRolloutRefWorker::export_weights);
  DataProto full = full_parts.list().front().dataproto();
  full.meta_info["weight_version"] = 3;
  CHECK_THROWS_WITH(rollout.call(&ActorRolloutRefWorker::load_weights, full), Catch::Contains("lora_rank"));
  auto full_rollout = group(rt, 1, "rollout", actor_rollout_ref_config(4));
  CHECK_THROWS_WITH(full_rollout.call(&ActorRolloutRefWorker::load_weights, weights), Catch::Contains("lora_rank"));
}

// LoRA under verl's mixed precision (param_dtype bf16) with a bf16 rollout (rollout.dtype=bfloat16), through the
// worker: the engine holds fp32 masters of the adapters (and of the frozen base, which never moves); the rollout
// serves the merged adapters in bf16 (the engine's compute copies: nothing left for the decode engine to cast)
// with its own log-probs near the actor's; checkpoints and their PEFT folder hold the fp32 masters.
TEST_CASE("LoRA under mixed precision with a bf16 rollout: fp32 adapter masters in both checkpoint layouts, "
          "frozen base, the rollout's log-probs near the actor's") {
  Runtime rt;
  const auto base = models::load_checkpoint_tensors(tiny_model_dir());
  for (auto [ws, fsdp_size] : {std::pair{1, 1}, std::pair{2, -1}}) {
    CAPTURE(ws, fsdp_size);
    auto config = lora_config();
    config["actor"]["fsdp_config"] = {{"fsdp_size", fsdp_size}, {"mixed_precision", {{"param_dtype", "bf16"}}}};
    config["rollout"]["dtype"] = "bfloat16";
    auto lora = group(rt, ws, "actor_rollout_ref", config);
    const DataProto scored = lora.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(4)));
    const DataProto ref_before = lora.call(&ActorRolloutRefWorker::compute_ref_log_prob, scored);
    for (int step = 0; step < 2; ++step) train_once(lora, 3 + static_cast<uint64_t>(step));

    // the bf16 rollout samples with its own log-probs: near the bf16 actor's, not equal
    DataProto gen = lora.call(&ActorRolloutRefWorker::generate_sequences, prompts(4, 5, 7));
    const at::Tensor mask = gen.batch.at("response_mask").to(torch::kBool);
    const at::Tensor actor = DataProto(lora.call(&ActorRolloutRefWorker::compute_log_prob, gen))
                                 .batch.at("old_log_probs");
    const at::Tensor diff = (gen.batch.at("rollout_log_probs") - actor).abs().masked_select(mask);
    CAPTURE(diff.max().item<double>(), diff.mean().item<double>());
    CHECK(diff.max().item<double>() > 0.0);
    CHECK(diff.mean().item<double>() < 0.05);

    // the base is frozen: the reference (adapters disabled) is unchanged bit for bit
    const DataProto ref_after = lora.call(&ActorRolloutRefWorker::compute_ref_log_prob, scored);
    CHECK(torch::equal(ref_after.batch.at("ref_log_prob"), ref_before.batch.at("ref_log_prob")));

    // the checkpoint holds fp32 masters: the base bit for bit, the adapters trained beyond bf16
    TempDir dir("lora_bf16");
    lora.call(&ActorRolloutRefWorker::save_checkpoint, dir.path.string(), int64_t{2});
    REQUIRE(parallel::is_sharded_checkpoint(dir.path));
    std::map<std::string, at::Tensor> adapters;
    int frozen = 0;
    bool beyond_bf16 = false;
    for (const auto& p : parallel::load_sharded_parameters(dir.path)) {
      CAPTURE(p.name);
      CHECK(p.tensor.scalar_type() == at::kFloat);
      if (p.name.find(".lora_") != std::string::npos) {
        adapters.emplace(p.name, p.tensor);
        beyond_bf16 = beyond_bf16 || !torch::equal(p.tensor, p.tensor.to(at::kBFloat16).to(at::kFloat));
        continue;
      }
      const auto it = std::find_if(base.begin(), base.end(), [&](const auto& t) { return t.first == p.name; });
      REQUIRE(it != base.end());
      CHECK(torch::equal(p.tensor, it->second));
      ++frozen;
    }
    CHECK(frozen > 0);
    CHECK(beyond_bf16);
    // the PEFT folder holds the same fp32 masters (not the gathered bf16 compute copies)
    const auto peft = models::read_safetensors(dir.path / "lora_adapter" / models::kAdapterWeightsFile);
    CHECK(peft.size() == adapters.size());
    for (const auto& [name, t] : peft) {
      CAPTURE(name);
      const std::string ours = name.substr(std::string("base_model.model.").size());
      REQUIRE(adapters.count(ours) == 1);
      CHECK(t.scalar_type() == at::kFloat);
      CHECK(torch::equal(t, adapters.at(ours)));
    }
  }
}

// A float32 LoRA policy (replicated) with a bf16 rollout: the served copy merges the adapters that changed and
// the decode engine casts (packs to bf16) just those, once per weight version.
TEST_CASE("LoRA with a bf16 rollout: merged and cast once per weight version") {
  Runtime rt;
  auto config = lora_config();
  config["rollout"]["dtype"] = "bfloat16";
  auto lora = group(rt, 1, "actor_rollout_ref", config);
  auto packed = [&] {
    const std::vector<Json> stats = lora.call(&ActorRolloutRefWorker::decode_stats);
    return stats.front().at("packed_weights").get<int64_t>();
  };
  lora.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(4)));
  CHECK(packed() == 2 * 7 + 1);  // the first rollout: every linear weight (q, k, v, o, gate, up, down; the head)
  lora.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(4)));
  CHECK(packed() == 0);  // the same version: nothing merged nor cast again
  train_once(lora);
  const DataProto after = lora.call(&ActorRolloutRefWorker::generate_sequences, prompts(4, 5, 7));
  CHECK(packed() == 2 * 7);  // the adapted layers (all-linear: not the head) once for the new version
  lora.call(&ActorRolloutRefWorker::generate_sequences, greedy(prompts(4)));
  CHECK(packed() == 0);
  // the engine's own bf16 log-probs, near the float32 actor's
  const at::Tensor mask = after.batch.at("response_mask").to(torch::kBool);
  const at::Tensor actor =
      DataProto(lora.call(&ActorRolloutRefWorker::compute_log_prob, after)).batch.at("old_log_probs");
  const at::Tensor diff = (after.batch.at("rollout_log_probs") - actor).abs().masked_select(mask);
  CAPTURE(diff.max().item<double>(), diff.mean().item<double>());
  CHECK(diff.max().item<double>() > 0.0);
  CHECK(diff.mean().item<double>() < 0.05);
}

TEST_CASE("LoRA critic: the value head trains in full, the base stays frozen: the PEFT checkpoint restores it") {
  Runtime rt;
  hyflow::workers::register_workers();
  auto config = critic_config(4);
  config["model"]["lora_rank"] = 4;
  config["model"]["lora_alpha"] = 8;
  auto make = [&] {
    WorkerGroup wg(rt, ResourcePool({1}), WorkerSpec{"CriticWorker", {{"config", config}}});
    wg.call(&CriticWorker::init_model);
    return wg;
  };
  auto critic = make();
  DataProto batch = critic_batch(4, 9, /*ragged=*/false);
  const DataProto before = critic.call(&CriticWorker::compute_values, batch);
  batch.union_with(before);
  critic.call(&CriticWorker::update_critic, batch);
  critic.call(&CriticWorker::update_critic, batch);
  const DataProto after = critic.call(&CriticWorker::compute_values, batch);
  CHECK_FALSE(torch::equal(before.batch.at("values"), after.batch.at("values")));
  TempDir dir("lora_critic");
  critic.call(&CriticWorker::save_checkpoint, dir.path.string(), int64_t{2});
  const auto cfg = models::read_adapter_config(dir.path / "lora_adapter");
  CHECK(cfg.modules_to_save == std::vector<std::string>{"score"});
  CHECK(cfg.task_type == "TOKEN_CLS");
  bool has_score = false;
  for (const auto& [name, t] : models::read_safetensors(dir.path / "lora_adapter" / "adapter_model.safetensors"))
    has_score = has_score || name == "base_model.model.score.weight";
  CHECK(has_score);
  // everything the updates changed is in the adapter folder: the base did not move
  auto resumed = make();
  resumed.call(&CriticWorker::load_checkpoint, dir.path.string());
  const DataProto again = resumed.call(&CriticWorker::compute_values, batch);
  CHECK(torch::equal(again.batch.at("values"), after.batch.at("values")));
}
