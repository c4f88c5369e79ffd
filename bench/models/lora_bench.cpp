// LoRA against full fine-tuning on the same model and batch (issue 30, docs/lora.md): trainable
// parameters, AdamW state bytes, peak memory (max RSS of a child process per case), step time
// (forward + backward + optimizer step), weight-sync bytes and time (export_weights' copy).
// Usage: lora_bench [--rank R] [--batch B] [--seq T] [--steps N] [--quick]
// Default: the stories42M shape (Llama, dim 512, 8 layers, vocab 32000, tied), rank 8 on all linear
// layers, batch 2 x 64 tokens, 3 timed steps after one warm-up step. --quick: a 2-layer 42M-width
// model and 1 step (the CI smoke run).
#include <hyflow/models/llama.hpp>
#include <hyflow/models/lora.hpp>
#include <hyflow/parallel/data_parallel.hpp>

#include "bench_json.hpp"

#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

using namespace hyflow;

namespace {

struct Options {
  int64_t rank = 8, batch = 2, seq = 64, steps = 3, layers = 8;
};

struct Figures {
  double trainable = 0, optimizer_bytes = 0, step_s = 0, sync_bytes = 0, sync_s = 0, peak_rss_mb = 0;
  // LoRA only: the rollout's two ways to serve base + adapter (docs/lora.md, Rollout)
  double merge_s = 0;         // MergedCopy::refresh of every adapted layer (once per weight sync)
  double side_token_s = 0;    // a decode-shaped forward (8 rows x 1 token) with the adapters as side products
  double merged_token_s = 0;  // the same forward on the merged copy
};

models::ModelConfig shape_42m(int64_t layers) {
  return models::ModelConfig{.architecture = "LlamaForCausalLM",
                             .vocab_size = 32000,
                             .hidden_size = 512,
                             .intermediate_size = 1376,
                             .num_hidden_layers = layers,
                             .num_attention_heads = 8,
                             .num_key_value_heads = 8,
                             .max_position_embeddings = 1024,
                             .tie_word_embeddings = true};
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One case in this process: build, (adapt), train `steps` steps, measure.
Figures run_case(const Options& o, bool lora) {
  torch::manual_seed(0);
  models::CausalLM model(shape_42m(o.layers));
  if (lora) models::apply_lora(*model, {.rank = o.rank, .alpha = 2.0 * static_cast<double>(o.rank)});
  auto params = models::trainable_parameters(*model);
  parallel::OptimConfig config{.lr = 1e-4, .lr_warmup_steps = 0};
  parallel::DataParallelOptimizer optimizer(params, config, nullptr, "bench.optim");
  const auto ids = torch::randint(0, 32000, {o.batch, o.seq});
  auto step = [&] {
    optimizer.zero_grad();
    auto logits = model->forward(ids.narrow(1, 0, o.seq - 1));
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                     ids.narrow(1, 1, o.seq - 1).reshape({-1}));
    loss.backward();
    optimizer.step(1.0);
  };
  step();  // warm-up: the AdamW state exists after it
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.steps; ++i) step();
  Figures f;
  f.step_s = seconds_since(start) / static_cast<double>(o.steps);
  for (const auto& p : params) f.trainable += static_cast<double>(p.numel());
  for (const auto& t : optimizer.state_tensors())
    f.optimizer_bytes += static_cast<double>(t.numel() * t.element_size());
  // weight sync: what export_weights copies (the trainable tensors under LoRA, everything otherwise)
  const auto sync_start = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : lora ? models::named_trainable_parameters(*model) : [&] {
         models::NamedTensors all;
         for (const auto& item : model->named_parameters()) all.emplace_back(item.key(), item.value());
         return all;
       }()) {
    auto copy = t.detach().clone();
    f.sync_bytes += static_cast<double>(copy.numel() * copy.element_size());
  }
  f.sync_s = seconds_since(sync_start);
  if (lora) {
    models::MergedCopy merged(model);
    const auto merge_start = std::chrono::steady_clock::now();
    merged.refresh(/*force=*/true);
    f.merge_s = seconds_since(merge_start);
    const auto tokens = torch::randint(0, 32000, {8, 1});
    auto time_forward = [&](models::CausalLM& m) {
      m->forward(tokens);  // warm
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) m->forward(tokens);
      return seconds_since(t0) / 20.0;
    };
    auto copy = merged.model();
    f.side_token_s = time_forward(model);
    f.merged_token_s = time_forward(copy);
  }
  return f;
}

// Runs a case in a child process so that its peak RSS is its own.
Figures in_child(const Options& o, bool lora) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Figures f = run_case(o, lora);
    if (write(fds[1], &f, sizeof f) != static_cast<ssize_t>(sizeof f)) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  Figures f;
  const bool got = read(fds[0], &f, sizeof f) == static_cast<ssize_t>(sizeof f);
  close(fds[0]);
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("benchmark child failed");
  f.peak_rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return std::stoll(argv[++i]); };
    if (a == "--rank" && i + 1 < argc) {
      o.rank = next();
    } else if (a == "--batch" && i + 1 < argc) {
      o.batch = next();
    } else if (a == "--seq" && i + 1 < argc) {
      o.seq = next();
    } else if (a == "--steps" && i + 1 < argc) {
      o.steps = next();
    } else if (a == "--quick") {
      o.layers = 2;
      o.steps = 1;
    } else {
      std::cerr << "usage: lora_bench [--rank R] [--batch B] [--seq T] [--steps N] [--quick]\n";
      return 2;
    }
  }
  torch::set_num_threads(1);
  const Figures full = in_child(o, false);
  const Figures lora = in_child(o, true);
  const std::string c = (o.layers == 8 ? std::string("42M") : "42M width, " + std::to_string(o.layers) + " layers") +
                        ", rank " + std::to_string(o.rank) + " all-linear, batch " + std::to_string(o.batch) + "x" +
                        std::to_string(o.seq) + ", 1 thread";
  using hyflow_bench::emit;
  emit("lora_trainable_params", c + ": LoRA (value) vs full (peer)", lora.trainable, "parameters", "full fine-tuning",
       full.trainable, full.trainable / lora.trainable);
  emit("lora_optimizer_state", c + ": AdamW state LoRA (value) vs full (peer)", lora.optimizer_bytes / 1048576.0,
       "MiB", "full fine-tuning", full.optimizer_bytes / 1048576.0, full.optimizer_bytes / lora.optimizer_bytes);
  emit("lora_optimizer_state_fraction", c + ": LoRA AdamW state / full (goal <= 0.02)",
       lora.optimizer_bytes / full.optimizer_bytes, "fraction", "goal (issue 30)", 0.02,
       0.02 / (lora.optimizer_bytes / full.optimizer_bytes));
  emit("lora_peak_rss", c + ": peak RSS of a training process, LoRA (value) vs full (peer)", lora.peak_rss_mb, "MB",
       "full fine-tuning", full.peak_rss_mb, full.peak_rss_mb / lora.peak_rss_mb);
  emit("lora_step_time", c + ": forward+backward+AdamW step, LoRA (value) vs full (peer)", lora.step_s, "s",
       "full fine-tuning", full.step_s, full.step_s / lora.step_s);
  emit("lora_sync_bytes", c + ": weight-sync bytes, adapters (value) vs full weights (peer)",
       lora.sync_bytes / 1048576.0, "MiB", "full weights", full.sync_bytes / 1048576.0,
       full.sync_bytes / lora.sync_bytes);
  emit("lora_sync_time", c + ": weight-sync copy time, adapters (value) vs full weights (peer)", lora.sync_s, "s",
       "full weights", full.sync_s, full.sync_s / std::max(1e-9, lora.sync_s));
  emit("lora_merge_time", c + ": merging every adapter into the served copy (value, once per weight sync) vs one "
       "training step (peer)", lora.merge_s, "s", "LoRA training step", lora.step_s, lora.step_s / lora.merge_s);
  emit("lora_side_product_step", c + ": decode-shaped forward (8 rows x 1 token), adapters as side products (value) "
       "vs merged weights (peer)", lora.side_token_s * 1e3, "ms", "merged copy", lora.merged_token_s * 1e3,
       lora.merged_token_s / lora.side_token_s);
  return 0;
}
