#include "common/tiny_model.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/lora.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>
#include <set>

using namespace hyflow;
using namespace hyflow::models;
using hyflow::testing::TempDir;
using hyflow::testing::tiny_model_config;
namespace fs = std::filesystem;

namespace {

LoraConfig rank4() {
  return LoraConfig{.rank = 4, .alpha = 8.0};
}

at::Tensor ids() {
  torch::manual_seed(7);
  return torch::randint(0, tiny_model_config().vocab_size, {2, 9});
}

// Moves every trainable parameter away from its value (B is zero after init).
void perturb(torch::nn::Module& m, double std = 0.05) {
  torch::NoGradGuard no_grad;
  for (auto& p : trainable_parameters(m)) p.add_(torch::randn_like(p) * std);
}

std::map<std::string, at::Tensor> snapshot(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : m.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

}  // namespace

TEST_CASE("LoRA: all-linear adapts every projection but the head; PEFT init leaves outputs unchanged") {
  torch::manual_seed(1);
  CausalLM model(tiny_model_config());
  const auto before = model->forward(ids());
  torch::manual_seed(2);
  const auto adapted = apply_lora(*model, rank4());
  const auto layers = tiny_model_config().num_hidden_layers;
  CHECK(static_cast<int64_t>(adapted.size()) == 7 * layers);
  CHECK(adapted.front() == "model.layers.0.self_attn.q_proj");
  CHECK(torch::equal(model->forward(ids()), before));  // B = 0
  for (const auto& item : model->named_parameters()) {
    const bool adapter = item.key().find(".lora_") != std::string::npos;
    CHECK(item.value().requires_grad() == adapter);
  }
  auto* q = model->model->layers[0]->as<DecoderLayerImpl>()->self_attn->q_proj.get();
  const auto& a = q->named_children()["lora_A"]->as<LoraAImpl>()->weight;
  CHECK(a.sizes() == at::IntArrayRef({4, q->weight.size(1)}));
  const double bound = 1.0 / std::sqrt(static_cast<double>(q->weight.size(1)));  // kaiming_uniform(a=sqrt(5))
  CHECK(a.abs().max().item<double>() <= bound);
  CHECK(a.abs().max().item<double>() > 0.5 * bound);
  // a seed gives the same adapters on every call
  CausalLM one(tiny_model_config()), two(tiny_model_config());
  apply_lora(*one, rank4(), {}, 5);
  torch::manual_seed(99);
  apply_lora(*two, rank4(), {}, 5);
  const auto s1 = adapter_state(*one), s2 = adapter_state(*two);
  for (size_t i = 0; i < s1.size(); ++i) CHECK(torch::equal(s1[i].second, s2[i].second));
  CHECK(q->named_children()["lora_B"]->as<torch::nn::LinearImpl>()->weight.abs().max().item<double>() == 0.0);
}

TEST_CASE("LoRA: target list, exclude_modules and errors name the problem") {
  CausalLM model(tiny_model_config());
  auto paths = apply_lora(*model, {.rank = 2, .target_modules = {"q_proj", "v_proj"},
                                   .exclude_modules = {"model.layers.0.self_attn.v_proj"}});
  CHECK(paths.size() == static_cast<size_t>(2 * tiny_model_config().num_hidden_layers - 1));
  CHECK_THROWS_WITH(apply_lora(*model, rank4()), Catch::Contains("already has adapters"));
  CausalLM other(tiny_model_config());
  CHECK_THROWS_WITH(apply_lora(*other, {.rank = 2, .target_modules = {"nope"}}), Catch::Contains("match no linear"));
  CHECK_THROWS_WITH(apply_lora(*other, {.rank = 2, .target_modules = {"input_layernorm"}}),
                    Catch::Contains("not a linear layer"));
  CHECK_THROWS_WITH(apply_lora(*other, {.rank = -1}), Catch::Contains("lora_rank"));
}

TEST_CASE("LoRA: training steps move only adapters; the frozen base stays bit-identical; optimizer state only "
          "for adapters") {
  torch::manual_seed(3);
  CausalLM model(tiny_model_config());
  apply_lora(*model, rank4());
  const auto start = snapshot(*model);
  auto params = trainable_parameters(*model);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    auto loss = model->forward(ids()).logsumexp(-1).mean();
    loss.backward();
    opt.step();
  }
  int64_t moved = 0;
  for (const auto& item : model->named_parameters()) {
    const bool adapter = item.key().find(".lora_") != std::string::npos;
    const bool same = torch::equal(item.value(), start.at(item.key()));
    if (!adapter) CHECK(same);
    if (!adapter) CHECK(!item.value().grad().defined());
    moved += (adapter && !same) ? 1 : 0;
  }
  CHECK(moved > 0);
  CHECK(opt.state().size() == params.size());
  int64_t adapter_count = 0;
  for (const auto& item : model->named_parameters())
    adapter_count += item.key().find(".lora_") != std::string::npos ? 1 : 0;
  CHECK(static_cast<int64_t>(params.size()) == adapter_count);
}

TEST_CASE("LoRA with gradient checkpointing: the adapters get the gradients they get without it") {
  torch::manual_seed(8);
  CausalLM model(tiny_model_config());
  apply_lora(*model, rank4());
  perturb(*model);
  auto grads = [&](bool checkpointing) {
    model->model->set_gradient_checkpointing(checkpointing);
    for (auto& p : trainable_parameters(*model)) p.mutable_grad().reset();
    model->forward(ids()).logsumexp(-1).mean().backward();
    std::vector<at::Tensor> out;
    for (auto& p : trainable_parameters(*model)) out.push_back(p.grad().clone());
    return out;
  };
  // the checkpointed layers are in the graph (a frozen embedding does not switch checkpointing off)
  model->model->set_gradient_checkpointing(true);
  const auto out = model->forward(ids());
  bool found = false;
  std::vector<torch::autograd::Node*> to_visit{out.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!to_visit.empty() && !found) {
    auto* node = to_visit.back();
    to_visit.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    found = node->name().find("CheckpointedLayer") != std::string::npos;
    for (const auto& edge : node->next_edges()) to_visit.push_back(edge.function.get());
  }
  CHECK(found);
  const auto plain = grads(false), checkpointed = grads(true);
  REQUIRE(plain.size() == checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(torch::allclose(checkpointed[i], plain[i], 1e-5, 1e-7));
}

TEST_CASE("LoRA: adapters disabled = a separately loaded base model, bit for bit") {
  TempDir dir("lora");
  torch::manual_seed(4);
  CausalLM base(tiny_model_config());
  save_pretrained(*base, base->config(), dir.path);
  auto policy = load_causal_lm(dir.path);
  apply_lora(*policy, rank4());
  perturb(*policy);
  auto reference = load_causal_lm(dir.path);
  torch::NoGradGuard no_grad;
  const auto expected = reference->forward(ids());
  CHECK(!torch::equal(policy->forward(ids()), expected));
  {
    DisableAdapters off;
    CHECK(!adapters_enabled());
    CHECK(torch::equal(policy->forward(ids()), expected));
  }
  CHECK(adapters_enabled());
  CHECK(!torch::equal(policy->forward(ids()), expected));
}

TEST_CASE("LoRA: merged = unmerged outputs to float32 rounding; MergedCopy follows adapter updates") {
  torch::manual_seed(5);
  CausalLM model(tiny_model_config());
  apply_lora(*model, rank4());
  perturb(*model);
  torch::NoGradGuard no_grad;
  const auto unmerged = model->forward(ids());
  CausalLM plain(tiny_model_config());
  load_parameters(*plain, merged_parameters(*model), "merged");
  CHECK(torch::allclose(plain->forward(ids()), unmerged, 1e-4, 1e-5));

  MergedCopy copy(model);
  CHECK(copy.refresh() == 7 * tiny_model_config().num_hidden_layers);  // the first merges every layer
  CHECK(torch::allclose(copy.model()->forward(ids()), unmerged, 1e-4, 1e-5));
  CHECK(copy.refresh() == 0);  // nothing changed
  // non-adapted parameters share the policy's storage
  CHECK(copy.model()->model->embed_tokens->weight.data_ptr() == model->model->embed_tokens->weight.data_ptr());
  perturb(*model);
  CHECK(copy.refresh() == 7 * tiny_model_config().num_hidden_layers);
  CHECK(torch::allclose(copy.model()->forward(ids()), model->forward(ids()), 1e-4, 1e-5));
}

TEST_CASE("LoRA: PEFT adapter files round trip with PEFT's names and fields") {
  TempDir dir("lora");
  torch::manual_seed(6);
  CausalLM model(tiny_model_config());
  const auto before = snapshot(*model);
  apply_lora(*model, {.rank = 4, .alpha = 16.0, .target_modules = {"all-linear"}});
  perturb(*model);
  save_adapter(*model, {.rank = 4, .alpha = 16.0}, "/models/base", dir.path);

  std::ifstream in(dir.path / kAdapterConfigFile);
  const auto cfg = nlohmann::json::parse(in);
  CHECK(cfg.at("peft_type") == "LORA");
  CHECK(cfg.at("task_type") == "CAUSAL_LM");
  CHECK(cfg.at("r") == 4);
  CHECK(cfg.at("lora_alpha") == 16.0);
  CHECK(cfg.at("base_model_name_or_path") == "/models/base");
  CHECK(cfg.at("target_modules") ==
        nlohmann::json({"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"}));
  for (const char* key : {"lora_dropout", "bias", "fan_in_fan_out", "modules_to_save"}) CHECK(cfg.contains(key));
  const auto tensors = read_safetensors(dir.path / kAdapterWeightsFile);
  CHECK(tensors.size() == static_cast<size_t>(2 * 7 * tiny_model_config().num_hidden_layers));
  CHECK(tensors.front().first == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");

  // a fresh base model takes the adapter (apply_adapter) and computes the same outputs
  CausalLM fresh(tiny_model_config());
  {
    torch::NoGradGuard no_grad;
    for (auto& item : fresh->named_parameters()) item.value().copy_(before.at(item.key()));
  }
  apply_adapter(*fresh, dir.path, "/models/base");
  torch::NoGradGuard no_grad;
  CHECK(torch::equal(fresh->forward(ids()), model->forward(ids())));
  // and an adapted model loads it in place
  CausalLM again(tiny_model_config());
  apply_lora(*again, {.rank = 4, .alpha = 16.0});
  load_adapter(*again, dir.path);
  const auto want = adapter_state(*model), got = adapter_state(*again);
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(want[i].first == got[i].first);
    CHECK(torch::equal(want[i].second, got[i].second));
  }
}

TEST_CASE("LoRA: loading an adapter with another base model, targets or rank fails naming the mismatch") {
  TempDir dir("lora");
  CausalLM model(tiny_model_config());
  apply_lora(*model, {.rank = 4, .alpha = 8.0, .target_modules = {"q_proj", "v_proj"}});
  save_adapter(*model, {.rank = 4, .alpha = 8.0}, "/models/base", dir.path);

  CausalLM other_targets(tiny_model_config());
  apply_lora(*other_targets, {.rank = 4, .alpha = 8.0, .target_modules = {"q_proj"}});
  CHECK_THROWS_WITH(load_adapter(*other_targets, dir.path),
                    Catch::Contains("target_modules") && Catch::Contains("only in the adapter: ") &&
                        Catch::Contains("model.layers.0.self_attn.v_proj"));
  CausalLM other_rank(tiny_model_config());
  apply_lora(*other_rank, {.rank = 2, .alpha = 8.0, .target_modules = {"q_proj", "v_proj"}});
  CHECK_THROWS_WITH(load_adapter(*other_rank, dir.path), Catch::Contains("r is 4, the model's is 2"));
  CausalLM plain(tiny_model_config());
  CHECK_THROWS_WITH(apply_adapter(*plain, dir.path, "/models/other"),
                    Catch::Contains("base_model_name_or_path is '/models/base'") &&
                        Catch::Contains("'/models/other'"));

  // a tensor of the wrong shape
  auto tensors = read_safetensors(dir.path / kAdapterWeightsFile);
  tensors.front().second = torch::zeros({3, 3});
  write_safetensors(dir.path / kAdapterWeightsFile, tensors);
  CausalLM same(tiny_model_config());
  apply_lora(*same, {.rank = 4, .alpha = 8.0, .target_modules = {"q_proj", "v_proj"}});
  CHECK_THROWS_WITH(load_adapter(*same, dir.path), Catch::Contains(tensors.front().first) && Catch::Contains("shape"));
}

TEST_CASE("LoRA on a value model: the score head trains in full (modules_to_save) and round trips") {
  TempDir dir("lora");
  ValueModel critic(tiny_model_config());
  apply_lora(*critic, rank4(), {"score"});
  CHECK(critic->score->weight.requires_grad());
  CHECK(critic->score->bias.requires_grad());
  CHECK(!critic->model->embed_tokens->weight.requires_grad());
  perturb(*critic);
  save_adapter(*critic, rank4(), "base", dir.path, {"score"}, "TOKEN_CLS");
  const auto tensors = read_safetensors(dir.path / kAdapterWeightsFile);
  bool has_score = false;
  for (const auto& [name, t] : tensors) has_score = has_score || name == "base_model.model.score.weight";
  CHECK(has_score);
  ValueModel fresh(tiny_model_config());
  {
    torch::NoGradGuard no_grad;
    auto src = critic->named_parameters();
    for (auto& item : fresh->named_parameters()) item.value().copy_(src[item.key()]);
  }
  apply_adapter(*fresh, dir.path);
  CHECK(read_adapter_config(dir.path).modules_to_save == std::vector<std::string>{"score"});
  torch::NoGradGuard no_grad;
  CHECK(torch::equal(fresh->forward(ids()), critic->forward(ids())));
}

TEST_CASE("LoRA dropout (PEFT's lora_dropout) acts on the adapter input in training mode only") {
  torch::manual_seed(9);
  CausalLM model(tiny_model_config());
  apply_lora(*model, {.rank = 4, .alpha = 8.0, .dropout = 0.5});
  perturb(*model);
  torch::NoGradGuard no_grad;
  model->eval();
  const auto eval_a = model->forward(ids()), eval_b = model->forward(ids());
  CHECK(torch::equal(eval_a, eval_b));
  model->train();
  CHECK_FALSE(torch::allclose(model->forward(ids()), eval_a, 1e-4, 1e-5));
  DisableAdapters off;  // without adapters there is nothing to drop
  const auto base_train = model->forward(ids());
  model->eval();
  CHECK(torch::equal(model->forward(ids()), base_train));
}
