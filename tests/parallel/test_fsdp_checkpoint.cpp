// Sharded checkpoints (hyflow/parallel/fsdp_checkpoint.hpp) of a tiny decoder LM: saved on 4
// ranks, loaded on 2 and 1, merged by hyflow-model-merger into a Hugging Face folder.
#include <hyflow/core/error.hpp>
#include <hyflow/core/net.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/parallel/fsdp_checkpoint.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>
#include "common/tiny_model.hpp"
#include "rank_threads.hpp"

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <thread>

using namespace hyflow;
using namespace hyflow::parallel;
namespace fs = std::filesystem;

namespace {

models::ModelConfig tiny() {
  models::ModelConfig c;
  c.architecture = "Qwen2ForCausalLM";  // QKV bias, none on o_proj
  c.vocab_size = 21;                    // rows that divide by neither 2 nor 4
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.qkv_bias = true;
  return c;
}

std::map<std::string, at::Tensor> initial_state() {
  torch::manual_seed(11);
  models::CausalLM model(tiny());
  std::map<std::string, at::Tensor> state;
  for (const auto& item : model->named_parameters()) state[item.key()] = item.value().detach().clone();
  return state;
}

models::CausalLM model_from(const std::map<std::string, at::Tensor>& state, bool zero = false) {
  models::CausalLM model(tiny());
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    if (zero)
      item.value().zero_();
    else
      item.value().copy_(state.at(item.key()));
  }
  return model;
}

std::shared_ptr<FsdpModule> shard(models::CausalLM& model, const std::shared_ptr<ProcessGroup>& pg, int64_t fsdp_size) {
  std::vector<NamedParameter> params;
  for (const auto& item : model->named_parameters()) params.push_back({item.key(), item.value()});
  return std::make_shared<FsdpModule>(units_by_layer(params, 0), make_device_mesh(pg, fsdp_size), FsdpOptions{});
}

using hyflow::testing::TempDir;
using test::run_ranks;

void save_on(int n, int64_t fsdp_size, const std::map<std::string, at::Tensor>& state, const fs::path& dir) {
  run_ranks(n, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = model_from(state);
    auto fsdp = shard(model, pg, fsdp_size);
    save_sharded_parameters(*fsdp, dir, {{"config", models::config_to_json(tiny())}}, pg.get());
  });
}

}  // namespace

TEST_CASE("a checkpoint saved on 4 ranks loads on 2 and on 1 rank and merges to a Hugging Face folder, all equal") {
  const auto state = initial_state();
  TempDir dir("n4");
  save_on(4, -1, state, dir.path);
  CHECK(fs::exists(dir.path / "fsdp_manifest.json"));
  for (int r = 0; r < 4; ++r) CHECK(fs::exists(dir.path / ("model_shard_" + std::to_string(r) + "_of_4.bin")));

  // Catch's assertions are not thread-safe: each rank records what differs, checked after.
  std::vector<std::vector<std::string>> differing(2);
  run_ranks(2, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = model_from(state, /*zero=*/true);
    auto fsdp = shard(model, pg, -1);
    load_sharded_parameters(*fsdp, dir.path);  // this rank's rows only
    fsdp->for_each_full_parameter([&](const std::string& name, const at::Tensor& full) {
      if (!torch::equal(full, state.at(name))) differing[static_cast<size_t>(pg->rank())].push_back(name);
    });
  });
  for (const auto& names : differing) CHECK(names.empty());

  {  // one rank: a module without a group reads every row
    auto model = model_from(state, /*zero=*/true);
    auto fsdp = shard(model, nullptr, -1);
    load_sharded_parameters(*fsdp, dir.path);
    for (const auto& item : model->named_parameters()) CHECK(torch::equal(item.value(), state.at(item.key())));
  }

  nlohmann::json extra;
  const auto one = load_sharded_parameters(dir.path, &extra);
  CHECK(one.size() == state.size());
  for (const auto& p : one) CHECK(torch::equal(p.tensor, state.at(p.name)));
  CHECK(extra.at("config").at("vocab_size") == 21);

  TempDir hf("hf");
  const std::string command = std::string(HYFLOW_MODEL_MERGER) + " merge --backend fsdp --local_dir " +
                              dir.path.string() + " --target_dir " + hf.path.string() + " > /dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  auto merged = models::load_causal_lm(hf.path);
  for (const auto& item : merged->named_parameters()) CHECK(torch::equal(item.value(), state.at(item.key())));
}

TEST_CASE("HYBRID_SHARD writes one replica's shards; they load as the full model") {
  const auto state = initial_state();
  TempDir dir("hybrid");
  save_on(4, 2, state, dir.path);
  CHECK(fs::exists(dir.path / "model_shard_1_of_2.bin"));
  CHECK_FALSE(fs::exists(dir.path / "model_shard_2_of_4.bin"));
  for (const auto& p : load_sharded_parameters(dir.path)) CHECK(torch::equal(p.tensor, state.at(p.name)));
  std::vector<std::vector<std::string>> differing(4);
  run_ranks(4, [&](const std::shared_ptr<ProcessGroup>& pg) {  // rows into a HYBRID_SHARD mesh again
    auto model = model_from(state, /*zero=*/true);
    auto fsdp = shard(model, pg, 2);
    load_sharded_parameters(*fsdp, dir.path);
    fsdp->for_each_full_parameter([&](const std::string& name, const at::Tensor& full) {
      if (!torch::equal(full, state.at(name))) differing[static_cast<size_t>(pg->rank())].push_back(name);
    });
  });
  for (const auto& names : differing) CHECK(names.empty());
}

TEST_CASE("AdamW state saved on 4 ranks loads row by row on 2 as the full state resharded does, bit for bit") {
  const auto state = initial_state();
  TempDir dir("optim");
  run_ranks(4, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = model_from(state);
    auto fsdp = shard(model, pg, -1);
    OptimConfig optim;
    optim.lr = 1e-2;
    ShardedOptimizer opt(fsdp, optim, "optim");
    for (auto& s : fsdp->local_shards())  // a gradient per row that differs between rows and ranks
      s.mutable_grad() = torch::linspace(-1, 1, s.numel()) * static_cast<double>(pg->rank() + 1);
    opt.step(1.0);
    opt.scheduler_step();
    save_sharded_checkpoint(*fsdp, &opt, dir.path, {}, pg.get());
  });
  test::RankChecks checks;
  run_ranks(2, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = model_from(state);
    auto fsdp = shard(model, pg, -1);
    OptimConfig optim;
    ShardedOptimizer by_rows(fsdp, optim, "optim"), by_full(fsdp, optim, "optim");
    load_sharded_optimizer(by_rows, *fsdp, dir.path);
    const auto full = load_sharded_optimizer(dir.path);
    by_full.load_full_state(full.parameters, full.scheduler_steps, dir.path.string());
    const auto a = by_rows.shard_state(), b = by_full.shard_state();
    RANK_CHECK(checks, a.size() == b.size() && !a.empty());
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      RANK_CHECK(checks, a[i].exp_avg.defined() && a[i].step == 1 && a[i].step == b[i].step);
      RANK_CHECK(checks, torch::equal(a[i].exp_avg, b[i].exp_avg) && torch::equal(a[i].exp_avg_sq, b[i].exp_avg_sq));
    }
    RANK_CHECK(checks, by_rows.scheduler_steps() == 1);
  });
  checks.report(2 * (2 + 2 * state.size()));
}

TEST_CASE("a rank reads only the shard files that hold its rows, and checks each block it reads") {
  const auto state = initial_state();
  TempDir dir("rows");
  save_on(2, -1, state, dir.path);
  const auto shard1 = dir.path / "model_shard_1_of_2.bin";
  {  // one bit of the first block of rank 1's file (the first layer's q_proj: its rows 8..15)
    std::fstream f(shard1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(17);
    f.put('\x7f');
  }
  test::RankChecks checks;
  run_ranks(2, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = model_from(state, /*zero=*/true);
    auto fsdp = shard(model, pg, -1);
    if (pg->rank() == 0) {
      load_sharded_parameters(*fsdp, dir.path);  // file 1 holds none of rank 0's rows
      RANK_CHECK(checks, true);
    } else {
      checks.throws<hyflow::FormatError>(
          [&] { load_sharded_parameters(*fsdp, dir.path); }, "rank 1's damaged block",
          {"model_shard_1_of_2.bin", "checksum", "model.layers.0.self_attn.q_proj.weight"});
    }
  });
  checks.report(2);
  fs::remove(shard1);
  run_ranks(2, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = model_from(state, /*zero=*/true);
    auto fsdp = shard(model, pg, -1);
    if (pg->rank() == 0) {
      load_sharded_parameters(*fsdp, dir.path);
      RANK_CHECK(checks, true);
    } else {
      checks.throws<hyflow::FormatError>([&] { load_sharded_parameters(*fsdp, dir.path); }, "rank 1's missing file",
                                         {"model_shard_1_of_2.bin"});
    }
  });
  checks.report(4);
}

TEST_CASE("a manifest without block checksums (older checkpoints) is read file by file, checked whole") {
  const auto state = initial_state();
  TempDir dir("v1");
  save_on(2, -1, state, dir.path);
  const auto mfile = dir.path / "fsdp_manifest.json";
  auto manifest = nlohmann::json::parse(std::ifstream(mfile));
  for (auto& f : manifest.at("shards")) f.erase("blocks");
  std::ofstream(mfile) << manifest.dump();
  std::vector<std::vector<std::string>> differing(2);
  run_ranks(2, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = model_from(state, /*zero=*/true);
    auto fsdp = shard(model, pg, -1);
    load_sharded_parameters(*fsdp, dir.path);
    fsdp->for_each_full_parameter([&](const std::string& name, const at::Tensor& full) {
      if (!torch::equal(full, state.at(name))) differing[static_cast<size_t>(pg->rank())].push_back(name);
    });
  });
  for (const auto& names : differing) CHECK(names.empty());
  {
    std::fstream f(dir.path / "model_shard_0_of_2.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x11');
  }
  CHECK_THROWS_WITH(load_sharded_parameters(dir.path),
                    Catch::Contains("model_shard_0_of_2.bin") && Catch::Contains("checksum"));
}

TEST_CASE("a damaged sharded checkpoint is a FormatError naming the file") {
  const auto state = initial_state();
  TempDir dir("damaged");
  save_on(2, -1, state, dir.path);
  const auto shard1 = dir.path / "model_shard_1_of_2.bin";
  {
    std::fstream f(shard1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(17);
    f.put('\x7f');
  }
  CHECK_THROWS_WITH(load_sharded_parameters(dir.path),
                    Catch::Contains("model_shard_1_of_2.bin") && Catch::Contains("checksum"));
  fs::resize_file(shard1, 40);
  CHECK_THROWS_WITH(load_sharded_parameters(dir.path),
                    Catch::Contains("model_shard_1_of_2.bin") && Catch::Contains("40 bytes"));
  fs::remove(shard1);
  CHECK_THROWS_AS(load_sharded_parameters(dir.path), hyflow::FormatError);
  fs::remove(dir.path / "fsdp_manifest.json");
  CHECK_THROWS_WITH(load_sharded_parameters(dir.path), Catch::Contains("fsdp_manifest.json"));
  TempDir hf("hf_bad");
  const std::string command = std::string(HYFLOW_MODEL_MERGER) + " merge --backend fsdp --local_dir " +
                              dir.path.string() + " --target_dir " + hf.path.string() + " 2> /dev/null";
  CHECK(std::system(command.c_str()) != 0);
}
