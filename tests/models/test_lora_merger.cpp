// hyflow-model-merger on PEFT adapter folders: the merged Hugging Face model computes what the
// adapted model computes (to float32 rounding); a base model of another shape fails naming the tensor.
#include "common/tiny_model.hpp"

#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/lora.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

using namespace hyflow::models;
using hyflow::testing::TempDir;
using hyflow::testing::tiny_model_config;

namespace {
int merger(const std::string& args, const std::filesystem::path& log) {
  const std::string command = std::string(HYFLOW_MODEL_MERGER) + " merge --backend fsdp " + args + " > " +
                              log.string() + " 2>&1";
  return std::system(command.c_str());
}

std::string read(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("hyflow-model-merger: a LoRA checkpoint merges into a Hugging Face model with the same outputs") {
  TempDir dir("lora_merger");
  const auto base_dir = dir.path / "base", ckpt = dir.path / "ckpt", out = dir.path / "merged";
  torch::manual_seed(11);
  CausalLM base(tiny_model_config());
  save_pretrained(*base, base->config(), base_dir);
  auto model = load_causal_lm(base_dir);
  apply_lora(*model, {.rank = 4, .alpha = 16.0});
  {
    torch::NoGradGuard no_grad;
    for (auto& p : trainable_parameters(*model)) p.add_(torch::randn_like(p) * 0.05);
  }
  save_adapter(*model, {.rank = 4, .alpha = 16.0}, base_dir.string(), ckpt / "lora_adapter");

  REQUIRE(merger("--local_dir " + ckpt.string() + " --target_dir " + out.string(), dir.path / "log") == 0);
  auto merged = load_causal_lm(out);
  CHECK(merged->named_parameters().size() == base->named_parameters().size());
  torch::NoGradGuard no_grad;
  torch::manual_seed(12);
  const auto ids = torch::randint(0, tiny_model_config().vocab_size, {3, 10});
  const auto expected = model->forward(ids);
  CHECK(torch::allclose(merged->forward(ids), expected, 1e-4, 1e-5));
  CHECK_FALSE(torch::allclose(base->forward(ids), expected, 1e-4, 1e-5));

  // another base model (other widths): the error names the tensor
  auto other = tiny_model_config();
  other.intermediate_size *= 2;
  CausalLM wide(other);
  save_pretrained(*wide, other, dir.path / "wide");
  CHECK(merger("--local_dir " + ckpt.string() + " --base_dir " + (dir.path / "wide").string() + " --target_dir " +
                   (dir.path / "bad").string(),
               dir.path / "log") != 0);
  const auto log = read(dir.path / "log");
  CHECK_THAT(log, Catch::Contains("mlp.gate_proj.lora_B.weight") || Catch::Contains("mlp.up_proj.lora_B.weight"));
  CHECK_THAT(log, Catch::Contains("shape"));
}
