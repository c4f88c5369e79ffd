// Mixed-precision training figures (issue 32, docs/parallel.md "Precision"): the actor update
// step on the ~110M shape (decode_bench's shape_110m: dim 768, hidden 2048, 12 layers, 12 heads,
// vocab 32000, tied), one micro-batch of 8 x 256 tokens (128 prompt + 128 response): forward,
// float32 log-probs of the responses, verl's vanilla PPO loss (token-mean, clip 0.2, on-policy),
// backward, gradient clipping and AdamW, on one rank, in three variants measured alternately in
// one run:
//   - fp32: the role's replicated path (plain model, DataParallelOptimizer: what one rank runs
//     without mixed_precision);
//   - bf16: fsdp_config.mixed_precision.param_dtype=bf16 (reduce_dtype fp32): the engine's float32
//     masters and AdamW state, bf16 compute copies, the forward through the engine's units and
//     head as the roles run it (workers/src/fsdp_model.cpp);
//   - the PyTorch twin (mixed_precision_peer.py): the same model and step in PyTorch 1.13 eager
//     under torch.autocast("cpu", bfloat16) with float32 AdamW, on the same number of threads.
// Step times are CPU time of the process at one thread (the machine is shared: CPU time leaves
// out the slices other jobs take), wall time above one thread; the median of the rounds.
// Peak memory: each hyflow variant in a fresh process (this program re-run with --memory
// VARIANT), two steps, the RSS high-water mark (VmHWM of /proc/self/status) minus the RSS before
// the model was built; the twin's the same way in its own process.
// Last, the GEMM rates behind the times (oneDNN fp32 inner product, at::mm in bf16, LibTorch's
// fp32 at::mm) on the step's largest shapes, and the attention products (torch::matmul, fp32 and
// bf16) as the models run them; --gemm-only prints only these.
//
// Usage: mixed_precision_bench [--threads N] [--rounds R] [--python PATH] [--no-peer] [--quick] [--gemm-only]
//        mixed_precision_bench --memory fp32|bf16   (one JSON line: the child of the memory figure)
#include "bench_json.hpp"

#include <hyflow/models/config.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/models/response_scores.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#ifndef HYFLOW_MIXED_PRECISION_PEER_SCRIPT
#error "HYFLOW_MIXED_PRECISION_PEER_SCRIPT must name mixed_precision_peer.py"
#endif

using namespace hyflow;
using parallel::FsdpModule;

namespace {

constexpr int64_t kBatch = 8, kPrompt = 128, kResponse = 128, kSeq = kPrompt + kResponse;

models::ModelConfig shape_110m() {
  return models::ModelConfig{.architecture = "LlamaForCausalLM",
                             .vocab_size = 32000,
                             .hidden_size = 768,
                             .intermediate_size = 2048,
                             .num_hidden_layers = 12,
                             .num_attention_heads = 12,
                             .num_key_value_heads = 12,
                             .max_position_embeddings = 1024,
                             .tie_word_embeddings = true};
}

double status_mb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;
  throw std::runtime_error("mixed_precision_bench: no " + key + " in /proc/self/status");
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Batch {
  at::Tensor ids, mask, positions, responses, advantages;
};

Batch make_batch() {
  torch::manual_seed(1);
  Batch b;
  b.ids = torch::randint(3, 32000, {kBatch, kSeq});
  b.mask = torch::ones_like(b.ids);
  b.positions = torch::arange(kSeq).expand({kBatch, kSeq});
  b.responses = b.ids.narrow(1, kPrompt, kResponse);
  b.advantages = torch::randn({kBatch, kResponse});
  return b;
}

// verl's vanilla PPO policy loss, token-mean over an all-ones response mask, on-policy.
at::Tensor ppo_loss(const at::Tensor& log_probs, const at::Tensor& advantages) {
  auto ratio = torch::exp(log_probs - log_probs.detach());
  return torch::max(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)).mean();
}

// One variant under training: the model, its optimizer and (bf16) the engine.
struct Variant {
  std::string name;
  models::CausalLM model{nullptr};
  std::shared_ptr<FsdpModule> fsdp;
  std::unique_ptr<parallel::Optimizer> optimizer;
};

parallel::OptimConfig optim() {
  parallel::OptimConfig o;
  o.lr = 1e-6;
  return o;
}

Variant make_variant(const std::string& name) {
  torch::manual_seed(0);
  Variant v;
  v.name = name;
  v.model = models::CausalLM(shape_110m());
  v.model->train();
  if (name == "fp32") {
    v.optimizer = std::make_unique<parallel::DataParallelOptimizer>(v.model->parameters(), optim(), nullptr, "optim");
    return v;
  }
  std::vector<parallel::NamedParameter> params;
  for (const auto& item : v.model->named_parameters()) params.push_back({item.key(), item.value()});
  v.fsdp = std::make_shared<FsdpModule>(parallel::units_by_layer(params, 0), parallel::DeviceMesh{},
                                        parallel::FsdpOptions{.mixed_precision = {.param_dtype = at::kBFloat16}});
  v.optimizer = std::make_unique<parallel::ShardedOptimizer>(v.fsdp, optim(), "optim");
  return v;
}

// The roles' forward through the engine (workers/src/fsdp_model.cpp: sharded_hidden_states and
// response_scores): every decoder layer one unit, the tied head through FsdpModule::head.
at::Tensor engine_logits(models::CausalLM& model, FsdpModule& fsdp, const Batch& b) {
  const auto& config = model->config();
  auto& transformer = *model->model;
  auto query_pos = torch::arange(0, kSeq).view({kSeq, 1});
  auto key_pos = torch::arange(0, kSeq).view({1, kSeq});
  auto blocked = (key_pos > query_pos).view({1, 1, kSeq, kSeq});
  fsdp.begin_forward();
  auto h = transformer.embed_tokens(b.ids);
  const models::RotaryEmbedding rotary(config.resolved_head_dim(), config.rope_theta, config.rope_scaling);
  auto [cos, sin] = rotary.cos_sin(b.positions, h.scalar_type());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto* layer = transformer.layers[static_cast<size_t>(i)]->as<models::DecoderLayerImpl>();
    const int unit = fsdp.find_unit("model.layers." + std::to_string(i));
    h = fsdp.enter_unit(unit, h);
    h = layer->forward(h, cos, sin, blocked, nullptr, i);
    h = fsdp.exit_unit(unit, h);
  }
  const auto& weight = transformer.embed_tokens->weight;
  return fsdp.head(transformer.norm(h), weight, [&model](const at::Tensor& x) { return model->logits(x); });
}

void step(Variant& v, const Batch& b) {
  v.optimizer->zero_grad();
  auto logits = v.fsdp ? engine_logits(v.model, *v.fsdp, b) : v.model(b.ids, b.mask, b.positions);
  auto scores = models::response_scores_from_logits(logits, b.responses, {});
  ppo_loss(scores.log_probs, b.advantages).backward();
  if (v.fsdp) v.fsdp->finish_backward();
  v.optimizer->step(1.0);
}

// The PyTorch twin as a child process: one request line in, one JSON line out.
class Peer {
 public:
  Peer(const std::string& python, int threads) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("mixed_precision_bench: pipe failed");
    const std::string t = std::to_string(threads);  // before fork: the child only dups and execs
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      execl(python.c_str(), python.c_str(), HYFLOW_MIXED_PRECISION_PEER_SCRIPT, "--threads", t.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  ~Peer() {
    std::fputs("quit\n", to_);
    std::fclose(to_);
    std::fclose(from_);
    waitpid(pid_, nullptr, 0);
  }
  nlohmann::json ask(const std::string& what) {
    std::fputs((what + "\n").c_str(), to_);
    std::fflush(to_);
    char line[4096];
    if (!std::fgets(line, sizeof line, from_)) throw std::runtime_error("mixed_precision_bench: the peer died");
    return nlohmann::json::parse(line);
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The child of the memory figure: two steps of `variant` in this fresh process.
int memory_child(const std::string& variant) {
  const double baseline = status_mb("VmRSS");
  const auto batch = make_batch();
  auto v = make_variant(variant);
  for (int i = 0; i < 2; ++i) step(v, batch);
  std::cout << nlohmann::json{{"hwm_mb", status_mb("VmHWM")}, {"baseline_mb", baseline}}.dump() << std::endl;
  return 0;
}

nlohmann::json run_memory_child(const std::string& variant, int threads) {
  const std::string cmd =
      "/proc/" + std::to_string(getpid()) + "/exe --threads " + std::to_string(threads) + " --memory " + variant;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("mixed_precision_bench: cannot run " + cmd);
  char line[4096];
  std::string last;
  while (std::fgets(line, sizeof line, pipe)) last = line;
  if (pclose(pipe) != 0 || last.empty()) throw std::runtime_error("mixed_precision_bench: failed: " + cmd);
  return nlohmann::json::parse(last);
}

// GFLOP/s of a (m, k) x (k, n) product by `fn`, best of 3.
double gflops(int64_t m, int64_t k, int64_t n, const std::function<void()>& fn, bool wall) {
  fn();
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const double c0 = cpu_seconds();
    const auto w0 = std::chrono::steady_clock::now();
    fn();
    const double s =
        wall ? std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() : cpu_seconds() - c0;
    best = std::min(best, s);
  }
  return 2.0 * static_cast<double>(m * k * n) / best / 1e9;
}

void gemm_figures(bool wall, int threads) {
  const int64_t m = kBatch * kSeq;
  struct Shape {
    const char* what;
    int64_t k, n;
  };
  for (const Shape& s : {Shape{"gate/up projection", 768, 2048}, Shape{"lm head", 768, 32000}}) {
    auto x = torch::randn({m, s.k}), w = torch::randn({s.n, s.k});
    auto xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16);
    auto wp = w.to_mkldnn();
    const double onednn = gflops(
        m, s.k, s.n, [&] { at::mkldnn_linear(x.to_mkldnn(), wp, c10::nullopt).to_dense(); }, wall);
    const double bf16 = gflops(
        m, s.k, s.n, [&] { at::mm(xb, wb.t()); }, wall);
    const double reference = gflops(
        std::min<int64_t>(m, 128), s.k, s.n, [&] { at::mm(x.narrow(0, 0, 128), w.t()); }, wall);
    const std::string shape = std::to_string(m) + " x " + std::to_string(s.k) + " x " + std::to_string(s.n);
    std::cout << nlohmann::json{{"bench", "mixed_precision_gemm"},
                                {"case",
                                 std::string(s.what) + " " + shape + ", " + std::to_string(threads) + " thread(s)"},
                                {"value", bf16},
                                {"unit", "GFLOP/s"},
                                {"peer", "oneDNN fp32 inner product (the models' fp32 linears)"},
                                {"peer_value", onednn},
                                {"ratio", bf16 / onednn},
                                {"torch_mm_fp32_gflops", reference}}
                     .dump()
              << std::endl;
  }
  // the attention products (scores = q k^T per head): at::matmul, as the models run them, in
  // fp32 (LibTorch's own GEMM) and in bf16 (oneDNN)
  const int64_t heads = kBatch * 12, d = 64;
  auto q = torch::randn({heads, kSeq, d}), k = torch::randn({heads, d, kSeq});
  auto qb = q.to(at::kBFloat16), kb = k.to(at::kBFloat16);
  const double fp32 = gflops(
      heads * kSeq, d, kSeq, [&] { torch::matmul(q, k); }, wall);
  const double bf16 = gflops(
      heads * kSeq, d, kSeq, [&] { torch::matmul(qb, kb); }, wall);
  hyflow_bench::emit("mixed_precision_gemm",
                     "attention scores " + std::to_string(heads) + " x (" + std::to_string(kSeq) + " x " +
                         std::to_string(d) + " x " + std::to_string(kSeq) + "), torch::matmul, " +
                         std::to_string(threads) + " thread(s)",
                     bf16, "GFLOP/s", "torch::matmul fp32 (LibTorch's GEMM)", fp32, bf16 / fp32);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, rounds = 3;
  bool peer = true, gemm_only = false;
  std::string python = "/usr/bin/python3", memory;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::stoi(argv[++i]);
    } else if (a == "--python" && i + 1 < argc) {
      python = argv[++i];
    } else if (a == "--memory" && i + 1 < argc) {
      memory = argv[++i];
    } else if (a == "--gemm-only") {
      gemm_only = true;
    } else if (a == "--no-peer") {
      peer = false;
    } else if (a == "--quick") {
      rounds = 1;
    } else {
      std::cerr << "usage: mixed_precision_bench [--threads N] [--rounds R] [--python PATH] [--no-peer] [--quick] "
                   "[--gemm-only]\n";
      return 2;
    }
  }
  torch::set_num_threads(threads);
  if (memory == "fp32" || memory == "bf16") return memory_child(memory);
  if (!memory.empty()) {
    std::cerr << "mixed_precision_bench: --memory takes fp32 or bf16, got '" << memory << "'\n";
    return 2;
  }
  const bool wall = threads > 1;
  if (gemm_only) {
    gemm_figures(wall, threads);
    return 0;
  }
  const auto batch = make_batch();
  std::vector<Variant> variants;
  variants.push_back(make_variant("fp32"));
  variants.push_back(make_variant("bf16"));
  std::unique_ptr<Peer> twin = peer ? std::make_unique<Peer>(python, threads) : nullptr;
  std::vector<std::vector<double>> times(3);
  auto timed = [&](size_t k, const std::function<void()>& fn) {
    const double c0 = cpu_seconds();
    const auto w0 = std::chrono::steady_clock::now();
    fn();
    times[k].push_back(wall ? std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count()
                            : cpu_seconds() - c0);
  };
  for (int r = 0; r <= rounds; ++r) {  // round 0 warms up
    for (size_t k = 0; k < variants.size(); ++k) timed(k, [&] { step(variants[k], batch); });
    if (twin) times[2].push_back(twin->ask("step")[wall ? "wall_s" : "cpu_s"].get<double>());
  }
  for (auto& t : times)
    if (!t.empty()) t.erase(t.begin());
  const double fp32 = median(times[0]), bf16 = median(times[1]);
  const std::string shape = "110M shape, actor update step (fwd + fp32 log-probs + PPO loss + bwd + AdamW), b" +
                            std::to_string(kBatch) + " x " + std::to_string(kSeq) + " tokens, " +
                            std::to_string(threads) + " thread(s), " + (wall ? "wall" : "CPU") + " s, median of " +
                            std::to_string(rounds);
  hyflow_bench::emit("mixed_precision_step", shape + ": bf16 mixed precision vs fp32", bf16, "s",
                     "hyflow fp32 (replicated path)", fp32, fp32 / bf16);
  if (twin) {
    const double torch_bf16 = median(times[2]);
    hyflow_bench::emit("mixed_precision_step", shape + ": bf16 mixed precision vs PyTorch autocast bf16", bf16, "s",
                       "pytorch-1.13 eager, autocast bf16 (mixed_precision_peer.py)", torch_bf16, torch_bf16 / bf16);
  }
  const double tokens = static_cast<double>(kBatch * kSeq);
  std::cout << nlohmann::json{{"bench", "mixed_precision_step_tokens_per_s"},
                              {"case", shape},
                              {"fp32", tokens / fp32},
                              {"bf16", tokens / bf16},
                              {"torch_autocast_bf16", twin ? tokens / median(times[2]) : 0.0},
                              {"rounds_s", times}}
                   .dump()
            << std::endl;

  // peak memory: fresh processes (the twin's own is fresh already)
  variants.clear();
  const auto m32 = run_memory_child("fp32", threads), m16 = run_memory_child("bf16", threads);
  const double p32 = m32["hwm_mb"].get<double>() - m32["baseline_mb"].get<double>();
  const double p16 = m16["hwm_mb"].get<double>() - m16["baseline_mb"].get<double>();
  hyflow_bench::emit("mixed_precision_peak_rss",
                     "110M shape, one rank, 2 update steps: RSS high-water (VmHWM) "
                     "minus RSS before the model, bf16 mixed precision vs fp32",
                     p16, "MB", "hyflow fp32 (replicated path)", p32, p32 / p16);
  if (twin) {
    const auto mt = twin->ask("memory");
    const double pt = mt["hwm_mb"].get<double>() - mt["baseline_mb"].get<double>();
    hyflow_bench::emit("mixed_precision_peak_rss",
                       "110M shape, one rank: VmHWM minus RSS before the model, bf16 mixed precision vs PyTorch "
                       "autocast bf16 (after its steps)",
                       p16, "MB", "pytorch-1.13 eager, autocast bf16", pt, pt / p16);
  }
  twin.reset();
  gemm_figures(wall, threads);
  return 0;
}
