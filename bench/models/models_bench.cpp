// Generation tokens/s and training-step tokens/s of the tiny and ~50M models on CPU, each
// against the PyTorch peer (peer_torch.py: the same model, KV-cache loop and step) run as a
// subprocess in the same run. One JSON object per figure on stdout.
//
// Usage: models_bench [--threads N] [--python /usr/bin/python3] [--case tiny|50m] [--quick]

#include "bench_json.hpp"

#include <hyflow/inference/generation.hpp>
#include <hyflow/models/llama.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <string>

using namespace hyflow;
using namespace hyflow::models;
using namespace hyflow::inference;

namespace {

struct Case {
  std::string name;
  ModelConfig config;
  int64_t gen_batch, prompt_len, new_tokens, train_batch, train_len, repeats;
};

double best_seconds(const std::function<void()>& fn, int64_t repeats) {
  fn();  // warm-up
  double best = 1e30;
  for (int64_t i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Runs the peer and returns {"generate": tok/s, "train": tok/s}.
std::map<std::string, double> run_peer(const std::string& python, const Case& c, int threads) {
  const std::string cmd = python + " " + HYFLOW_MODELS_PEER_SCRIPT + " --case " + c.name +
                          " --threads " + std::to_string(threads) + " --gen-batch " + std::to_string(c.gen_batch) +
                          " --prompt-len " + std::to_string(c.prompt_len) + " --new-tokens " +
                          std::to_string(c.new_tokens) + " --train-batch " + std::to_string(c.train_batch) +
                          " --train-len " + std::to_string(c.train_len) + " --repeats " + std::to_string(c.repeats);
  std::map<std::string, double> out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("models_bench: cannot run " + cmd);
  char line[4096];
  while (fgets(line, sizeof line, pipe)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("what")) out[j["what"].get<std::string>()] = j["tokens_per_s"].get<double>();
  }
  if (pclose(pipe) != 0 || out.size() != 2) throw std::runtime_error("models_bench: peer failed: " + cmd);
  return out;
}

void emit(const std::string& bench, const std::string& case_name, double value, double peer_value) {
  hyflow_bench::emit(bench, case_name, value, "tokens/s", "pytorch-1.13 eager (peer_torch.py)", peer_value,
                     value / peer_value);
}

struct Timing {
  double generate_s, train_s;
};

// Times greedy generation and one training step with the current linear-kernel setting.
Timing time_model(const Case& c) {
  torch::manual_seed(0);
  CausalLM model(c.config);
  // Prompts: every other row left-padded to half length (as in the peer).
  auto ids = torch::randint(c.config.vocab_size, {c.gen_batch, c.prompt_len});
  auto mask = torch::ones_like(ids);
  for (int64_t b = 1; b < c.gen_batch; b += 2) mask[b].narrow(0, 0, c.prompt_len / 2).zero_();
  DataProto prompts(TensorDict{{"input_ids", ids}, {"attention_mask", mask}});
  GenerationOptions gen{.max_new_tokens = c.new_tokens, .do_sample = false, .eos_token_ids = {-1}};
  const double gen_s = best_seconds([&] { generate(model, prompts, gen); }, c.repeats);

  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  auto train_ids = torch::randint(c.config.vocab_size, {c.train_batch, c.train_len});
  auto positions = torch::arange(c.train_len).expand({c.train_batch, c.train_len});
  auto step = [&] {
    auto logits = model(train_ids, torch::ones_like(train_ids), positions);
    const int64_t V = c.config.vocab_size, T = c.train_len;
    auto loss = torch::nn::functional::cross_entropy(logits.narrow(1, 0, T - 1).reshape({-1, V}),
                                                     train_ids.narrow(1, 1, T - 1).reshape({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  return {gen_s, best_seconds(step, c.repeats)};
}

void run_case(const Case& c, const std::string& python, int threads) {
  set_onednn_linear(true);
  const auto fast = time_model(c);
  set_onednn_linear(false);  // nn::Linear on LibTorch's BLAS: the peer's kernels exactly
  const auto plain = time_model(c);
  set_onednn_linear(true);
  const auto peer = run_peer(python, c, threads);

  const auto model = c.name + " (" + std::to_string(c.config.num_parameters() / 1000) + "k params)";
  const auto t = ", " + std::to_string(threads) + " threads";
  const auto gen = model + " greedy b" + std::to_string(c.gen_batch) + " p" + std::to_string(c.prompt_len) + " +" +
                   std::to_string(c.new_tokens) + " KV cache";
  const auto train = model + " fwd+bwd+AdamW b" + std::to_string(c.train_batch) + " x " + std::to_string(c.train_len);
  const double gen_tokens = static_cast<double>(c.gen_batch * c.new_tokens);
  const double train_tokens = static_cast<double>(c.train_batch * c.train_len);
  emit("models_generate", gen + ", oneDNN linears" + t, gen_tokens / fast.generate_s, peer.at("generate"));
  emit("models_generate", gen + ", same kernels as peer" + t, gen_tokens / plain.generate_s, peer.at("generate"));
  emit("models_train_step", train + ", oneDNN linears" + t, train_tokens / fast.train_s, peer.at("train"));
  emit("models_train_step", train + ", same kernels as peer" + t, train_tokens / plain.train_s, peer.at("train"));
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  bool quick = false;
  std::string only;  // run one case (tiny | 50m); all when empty
  std::string python = "/usr/bin/python3";  // Debian's python3-torch (same LibTorch 1.13 kernels)
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (a == "--python" && i + 1 < argc) {
      python = argv[++i];
    } else if (a == "--case" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--quick") {
      quick = true;
    } else {
      std::cerr << "usage: models_bench [--threads N] [--python PATH] [--case tiny|50m] [--quick]\n";
      return 2;
    }
  }
  torch::set_num_threads(threads);
  const int64_t r = quick ? 1 : 3;
  std::vector<Case> cases = {
      {"tiny", tiny_config(64), 8, 16, 64, 8, 64, r},
      {"50m", bench_50m_config(), 4, 16, 16, 2, 64, quick ? 1 : 2},
  };
  // The peer's configs are written out in peer_torch.py; they must describe the same models.
  for (const auto& c : cases) {
    if (only.empty() || only == c.name) run_case(c, python, threads);
  }
  return 0;
}
