// The rollout's decode engine against the machine's limits and against today's generate(),
// all measured in the same run (issue 17). One JSON object per figure on stdout:
//   memory_bandwidth       read of a buffer far larger than the caches (the roofline's limit)
//   sgemm                  a large float32 matrix product: torch::mm and oneDNN (the compute peer)
//   decode_tokens_per_s    engine vs reference generate() at batch 1/8/32, tokens identical or not
//   decode_roofline        batch-1 step time vs (weights + KV bytes) / bandwidth
//   decode_step_overhead   batch-1 step time minus the roofline time
//   decode_batch_scaling   batch-b tokens/s / batch-1 tokens/s
//   decode_profile         batch-1 and batch-32 steps: GEMM over all weights, attention, the rest
//   decode_gflops          batch-32 arithmetic rate vs the sgemm peers
//   prefix_sharing_*       prefill time and KV bytes per prompt, n = 8 vs n = 1
//   continuous_batching    tokens/s with response lengths varying 10x, vs static batches
//   decode_aten_cpu        the engine's ATen backend (the device path) vs its CPU kernels on CPU tensors
//   decode_bf16_*          (--case bf16) the bf16 engine vs the float32 one, batch 1 / 8 / 32, alternating
//                          rounds in one process, medians; batch 1 also vs llama2.c (its recorded figure,
//                          or with --llama2c its run.c measured side by side) and the bytes per token vs
//                          the roofline
//   decode_device_*        on cuda:0 (Qwen2-0.5B shape, bf16): engine tokens/s vs a PyTorch eager loop on the
//                          same device, and the HBM roofline fraction; one "skipped" line without a GPU
//
// Usage: decode_bench [--threads N] [--quick] [--wall] [--case gemm|42m|110m|scaling|aten|device|bf16]
//                     [--llama2c RUN [--llama2c-dir DIR]]
// (--llama2c: with --case bf16, karpathy/llama2.c's run.c binary RUN runs side by side at batch 1 on the
// same weights, written with a tokenizer.bin to DIR, default /tmp; bench/inference/llama2c_peer.sh)
// (scaling: the engine's decode-step figures of both shapes alone, without the reference
// generate() and the token check, for repeated runs)
// Times are CPU time of the process unless --wall or --threads above 1 (see now_s); the device
// figures are wall time after a device synchronization.

#include "bench_json.hpp"

#include "../../inference/src/decode/kernels.hpp"

#include <hyflow/cuda/linear.hpp>
#include <hyflow/inference/decode_engine.hpp>
#include <hyflow/inference/generation.hpp>

#include <torch/cuda.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <hyflow/core/error.hpp>

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace hyflow;
using namespace hyflow::models;
using namespace hyflow::inference;

namespace {

// CPU time of the process (every figure runs on one thread): the development machine is shared
// with other jobs, and CPU time leaves out the time slices they take. On an idle machine it
// equals wall time; --wall switches back to wall time.
bool g_wall = false;

// LibTorch intra-op threads (--threads): the engine's GEMM and attention split over them.
std::string threads_label() {
  const int n = at::get_num_threads();
  return std::to_string(n) + (n == 1 ? " thread" : " threads");
}

double now_s() {
  if (g_wall) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double seconds(const std::function<void()>& fn) {
  const double t0 = now_s();
  fn();
  return now_s() - t0;
}

double best_of(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) best = std::min(best, seconds(fn));
  return best;
}

void emit(const std::string& bench, const std::string& case_name, double value, const std::string& unit,
          const std::string& peer, double peer_value, double ratio, nlohmann::json extra = {}) {
  nlohmann::json line{{"bench", bench}, {"case", case_name},        {"value", value}, {"unit", unit},
                      {"peer", peer},   {"peer_value", peer_value}, {"ratio", ratio}};
  if (extra.is_object()) line.update(extra);
  std::cout << line.dump() << std::endl;
}

// Sums of a float buffer read as `streams` interleaved sequential streams, 4 independent vector
// accumulators so the loop is bound by memory, not by an add chain (AVX2 where the CPU has
// it, else plain C++).
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) float read_avx2(const float* p, size_t n, size_t streams) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const size_t part = n / streams / 32 * 32;
  for (size_t i = 0; i < part; i += 32) {
    for (size_t s = 0; s < streams; ++s) {
      const float* q = p + s * part + i;
      acc[0] = _mm256_add_ps(acc[0], _mm256_loadu_ps(q));
      acc[1] = _mm256_add_ps(acc[1], _mm256_loadu_ps(q + 8));
      acc[2] = _mm256_add_ps(acc[2], _mm256_loadu_ps(q + 16));
      acc[3] = _mm256_add_ps(acc[3], _mm256_loadu_ps(q + 24));
    }
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

// The batch-1 GEMV's access pattern (inference/src/decode/kernels.cpp, gemv_avx512): 8 sequential streams
// read a 64-byte line each per step, each fetching its line 4 KiB ahead into L2 (prefetcht1).
__attribute__((target("avx2"))) float read_ahead_avx2(const float* p, size_t n) {
  constexpr size_t kStreams = 8, kAhead = 4096 / sizeof(float);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const size_t part = n / kStreams / 16 * 16;
  for (size_t i = 0; i < part; i += 16) {
    for (size_t s = 0; s < kStreams; ++s) {
      const float* q = p + s * part + i;
      _mm_prefetch(reinterpret_cast<const char*>(q + kAhead), _MM_HINT_T1);
      acc[s % 2 * 2] = _mm256_add_ps(acc[s % 2 * 2], _mm256_loadu_ps(q));
      acc[s % 2 * 2 + 1] = _mm256_add_ps(acc[s % 2 * 2 + 1], _mm256_loadu_ps(q + 8));
    }
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

float read_portable(const float* p, size_t n, size_t streams) {
  float acc[16] = {};
  const size_t part = n / streams / 16 * 16;
  for (size_t i = 0; i < part; i += 16) {
    for (size_t s = 0; s < streams; ++s) {
      for (size_t l = 0; l < 16; ++l) acc[l] += p[s * part + i + l];
    }
  }
  float sum = 0.0F;
  for (float a : acc) sum += a;
  return sum;
}

// The read bandwidth the roofline uses: the best of 1 and 4 streams, and (x86 with AVX2) of 8 streams
// fetched 4 KiB ahead into L2 (`8streams_l2ahead`, the batch-1 GEMV's pattern: on this Zen 4 it reads
// faster than plain streams, which the hardware prefetchers alone keep fewer lines in flight for), over
// 256 MiB and 1 GiB buffers (8 and 32 times the 32 MiB L3), each best of 3 after a first touch. With several
// intra-op threads each reads its own slice at the same time (the engine's threads share the
// machine's bandwidth the same way).
double read_bandwidth_gbs(nlohmann::json& detail) {
  double best = 0.0;
  const int64_t threads = at::get_num_threads();
  for (size_t mib : {256, 1024}) {
    const size_t n = (mib << 20) / sizeof(float);
    const size_t slice = n / static_cast<size_t>(threads);
    std::vector<float> buffer(n, 1.0F);
    for (size_t streams : {1, 4, 8}) {
      const bool ahead = streams == 8;  // 8: read_ahead_avx2
#if defined(__x86_64__) || defined(__i386__)
      if (ahead && !__builtin_cpu_supports("avx2")) continue;
#else
      if (ahead) continue;
#endif
      std::vector<float> sinks(static_cast<size_t>(threads));
      const double s = best_of(3, [&] {
        decode::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            const float* part = buffer.data() + static_cast<size_t>(t) * slice;
#if defined(__x86_64__) || defined(__i386__)
            if (__builtin_cpu_supports("avx2")) {
              sinks[static_cast<size_t>(t)] = ahead ? read_ahead_avx2(part, slice) : read_avx2(part, slice, streams);
              continue;
            }
#endif
            sinks[static_cast<size_t>(t)] = read_portable(part, slice, streams);
          }
        });
      });
      volatile float sink = sinks[0];
      (void)sink;
      const size_t whole = ahead ? 16 : 32;  // floats per stream and step
      const double bytes = static_cast<double>(slice / streams / whole * whole * streams * sizeof(float) *
                                               static_cast<size_t>(threads));
      const double gbs = bytes / s / 1e9;
      detail[std::to_string(mib) + "MiB_" + std::to_string(streams) + (ahead ? "streams_l2ahead_gbs" : "streams_gbs")] =
          gbs;
      best = std::max(best, gbs);
    }
  }
  return best;
}

double copy_bandwidth_gbs() {
  const size_t bytes = size_t{512} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const double s = best_of(3, [&] { std::memcpy(b.data(), a.data(), bytes); });
  return 2.0 * static_cast<double>(bytes) / s / 1e9;  // read + write
}

ModelConfig shape_42m() {
  return ModelConfig{.architecture = "LlamaForCausalLM",
                     .vocab_size = 32000,
                     .hidden_size = 512,
                     .intermediate_size = 1376,
                     .num_hidden_layers = 8,
                     .num_attention_heads = 8,
                     .num_key_value_heads = 8,
                     .max_position_embeddings = 1024,
                     .tie_word_embeddings = true};
}

ModelConfig shape_110m() {
  auto c = shape_42m();
  c.hidden_size = 768;
  c.intermediate_size = 2048;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 12;
  c.num_key_value_heads = 12;
  return c;
}

// Bytes a decode step reads: every weight matrix once (the tied head is the embedding; the
// embedding lookup itself reads one row) plus, per layer, the keys and values cached so far.
double step_bytes(const ModelConfig& c, double mean_context) {
  const double params = static_cast<double>(c.num_parameters());
  const double embed = static_cast<double>(c.vocab_size * c.hidden_size);
  const double weights = c.tie_word_embeddings ? params : params - embed;
  const double kv = static_cast<double>(c.num_hidden_layers) * 2.0 * mean_context *
                    static_cast<double>(c.num_key_value_heads * c.resolved_head_dim());
  return 4.0 * (weights + kv);
}

DataProto random_prompts(int64_t batch, int64_t len, int64_t vocab) {
  auto ids = torch::randint(3, vocab, {batch, len});
  return DataProto(TensorDict{{"input_ids", ids}, {"attention_mask", torch::ones_like(ids)}});
}

struct Figures {
  double bandwidth, sgemm_mm, sgemm_onednn;
};

// Where a decode step of `batch` rows goes: the engine's GEMM over every weight matrix of the
// model (the real parameters, packed, `batch` activation rows), its attention for every row,
// layer and head over the mean context (each row its own keys and values), and the rest (norms,
// rotary, SwiGLU, KV writes, argmax, scheduling) as the remainder.
void profile_step(const std::string& name, CausalLM& model, double mean_context, double step_s, int64_t batch) {
  c10::InferenceMode inference;
  const auto& c = model->config();
  std::vector<std::pair<std::vector<float>, std::pair<int64_t, int64_t>>> mats;  // packed weight, (out, in)
  auto add = [&](const at::Tensor& t) {
    std::vector<float> packed(static_cast<size_t>(decode::packed_size(t.size(1), t.size(0))));
    decode::pack_weight(t.data_ptr<float>(), t.size(1), t.size(0), packed.data());
    mats.push_back({std::move(packed), {t.size(0), t.size(1)}});
  };
  for (const auto& item : model->named_parameters()) {
    const auto& t = item.value();
    if (t.dim() != 2 || item.key().find("embed_tokens") != std::string::npos) continue;
    add(t);
  }
  add(c.tie_word_embeddings ? model->model->embed_tokens->weight : model->lm_head->weight);
  const int64_t widest = std::max(c.intermediate_size, c.vocab_size);
  std::vector<float> x(static_cast<size_t>(widest * batch), 0.5F), y(static_cast<size_t>(widest * batch));
  const double linear_s = best_of(3, [&] {
    for (const auto& [w, shape] : mats) {
      decode::linear(x.data(), shape.second, batch, w.data(), nullptr, shape.second, shape.first, y.data(), shape.first,
                     false);
    }
  });
  const int64_t D = c.resolved_head_dim(), kvdim = c.num_key_value_heads * D, bs = 16;
  const auto len = static_cast<int64_t>(mean_context);
  const int64_t blocks = (len + bs - 1) / bs;
  // Row r's blocks are r * blocks .. (r + 1) * blocks - 1 of one pool per layer, laid out as the
  // engine's: (block, kv head, position in block, head_dim).
  // Huge pages where the kernel gives them, as the engine's pool asks for.
  auto keys = at::empty({c.num_hidden_layers, batch * blocks * bs, kvdim}), values = at::empty_like(keys);
  for (auto* t : {&keys, &values}) {
    decode::advise_huge_pages(t->data_ptr(), t->nbytes());
    t->normal_();
  }
  std::vector<int32_t> table(static_cast<size_t>(batch * blocks));
  for (int64_t b = 0; b < batch * blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  // The engine's call: every row's query heads of a layer at once, on the intra-op threads.
  const int64_t qdim = c.num_attention_heads * D;
  std::vector<float> q(static_cast<size_t>(batch * qdim), 0.1F), out(static_cast<size_t>(batch * qdim));
  std::vector<const int32_t*> tables(static_cast<size_t>(batch));
  std::vector<int64_t> lengths(static_cast<size_t>(batch), len);
  for (int64_t r = 0; r < batch; ++r) tables[static_cast<size_t>(r)] = table.data() + r * blocks;
  const double attention_s = best_of(3, [&] {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      decode::attend_rows(q.data(), keys[l].data_ptr<float>(), values[l].data_ptr<float>(), tables.data(),
                          lengths.data(), batch, c.num_attention_heads, c.num_key_value_heads, D, bs, out.data());
    }
  });
  const nlohmann::json parts{{"gemm_ms", linear_s * 1e3},
                             {"attention_ms", attention_s * 1e3},
                             {"rest_ms", (step_s - linear_s - attention_s) * 1e3}};
  emit("decode_profile",
       name + " batch " + std::to_string(batch) + " step: GEMM over all weights (value) vs whole step (peer)",
       linear_s * 1e3, "ms", "whole decode step", step_s * 1e3, linear_s / step_s, parts);
}

// engine_only: the decode-step figures alone (no reference generate(), no token check), for
// repeated runs of the scaling figures.
void bench_shape(const std::string& name, const ModelConfig& config, const Figures& f, bool quick, bool engine_only) {
  torch::manual_seed(0);
  CausalLM model(config);
  const int64_t prompt_len = 16, new_tokens = quick ? 32 : 128;
  // One engine per batch, kept for the paired rounds of the scaling figures below.
  struct Stepper {
    std::unique_ptr<DecodeEngine> engine;
    std::vector<DecodeRequest> long_run, short_run;
  };
  std::map<int64_t, Stepper> steppers;
  const DecodeSampling greedy{.sampling = {.greedy = true}};
  // Decode steps alone: the difference between runs of new_tokens and new_tokens / 2 tokens (same
  // prompts, so the prefill cancels), per step. Each run the best of 3: one slow run (another
  // process, a page fault burst) would move the difference by a whole step's worth at batch 1.
  auto step_of = [&](Stepper& s) {
    return (best_of(3, [&] { s.engine->run(s.long_run, greedy); }) -
            best_of(3, [&] { s.engine->run(s.short_run, greedy); })) /
           static_cast<double>(new_tokens - new_tokens / 2);
  };
  for (int64_t batch : {1, 8, 32}) {
    auto prompts = random_prompts(batch, prompt_len, config.vocab_size);
    GenerationOptions opts{.max_new_tokens = new_tokens, .do_sample = false};
    if (!engine_only) {
      DataProto reference, fast;
      const double ref_s = seconds([&] { reference = generate(model, prompts, opts); });
      opts.engine = GenerationEngine::kDecode;
      generate(model, prompts, opts);  // warm-up: the KV pool's first touch
      const double fast_s = seconds([&] { fast = generate(model, prompts, opts); });
      const bool identical = torch::equal(reference.batch["responses"], fast.batch["responses"]);
      const double tokens = static_cast<double>(batch * new_tokens);
      const std::string c = name + " greedy b" + std::to_string(batch) + " p" + std::to_string(prompt_len) + " +" +
                            std::to_string(new_tokens) + ", " + threads_label();
      emit("decode_tokens_per_s", c, tokens / fast_s, "tokens/s", "reference generate() (oneDNN linears)",
           tokens / ref_s, ref_s / fast_s, {{"tokens_identical", identical}});
    }

    auto& stepper = steppers[batch];
    stepper.engine = std::make_unique<DecodeEngine>(model);
    auto requests_of = [&](int64_t tokens) {
      std::vector<DecodeRequest> requests;
      auto ids = prompts.batch["input_ids"];
      for (int64_t b = 0; b < batch; ++b) {
        std::vector<int64_t> p(static_cast<size_t>(prompt_len));
        for (int64_t t = 0; t < prompt_len; ++t) p[static_cast<size_t>(t)] = ids[b][t].item<int64_t>();
        requests.push_back(DecodeRequest{.prompt = p, .max_new_tokens = tokens, .first_row_id = b});
      }
      return requests;
    };
    stepper.long_run = requests_of(new_tokens);
    stepper.short_run = requests_of(new_tokens / 2);
    stepper.engine->run(stepper.long_run, greedy);  // warm-up; packs every weight (the engine is new)
    const double pack_s = stepper.engine->stats().pack_s;
    const double step_s = step_of(stepper);
    const double mean_context = static_cast<double>(prompt_len) + 0.75 * static_cast<double>(new_tokens);
    // Every sequence reads its own keys and values: the KV term grows with the batch.
    const double bytes = step_bytes(config, mean_context * static_cast<double>(batch));
    const double roof_s = bytes / (f.bandwidth * 1e9);
    if (batch != 8) profile_step(name, model, mean_context, step_s, batch);
    if (batch == 1) {
      emit("decode_roofline", name + " batch 1 decode step, " + threads_label(), roof_s / step_s,
           "fraction of roofline", "bytes per step / measured read bandwidth (ms)", roof_s * 1e3, roof_s / step_s,
           {{"step_ms", step_s * 1e3},
            {"bytes_per_step", bytes},
            {"bandwidth_gbs", f.bandwidth},
            {"pack_all_weights_ms", pack_s * 1e3}});
      emit("decode_step_overhead", name + " batch 1: step time minus roofline time", (step_s - roof_s) * 1e3, "ms",
           "goal (issue 17, 42M)", 1.0, 1.0 / std::max(1e-9, (step_s - roof_s) * 1e3));
    }
    if (batch == 32) {
      // 2 flops per weight per token, plus attention: q.k and p.v over the mean context.
      const double weights = step_bytes(config, 0.0) / 4.0;
      const double attention = 4.0 * static_cast<double>(config.num_hidden_layers) * mean_context *
                               static_cast<double>(config.num_attention_heads * config.resolved_head_dim());
      const double flops = static_cast<double>(batch) * (2.0 * weights + attention);
      const double gflops = flops / step_s / 1e9;
      emit("decode_gflops", name + " batch 32 decode step, " + threads_label(), gflops, "GFLOP/s",
           "oneDNN sgemm 2048^3", f.sgemm_onednn, gflops / f.sgemm_onednn, {{"torch_mm_gflops", f.sgemm_mm}});
    }
  }
  // Batch scaling from rounds that measure the batch-1, 8 and 32 steps back to back: the read
  // bandwidth this machine gets moves by a third within minutes, and the batch-1 step follows it
  // (the batched ones far less), so a ratio of steps measured apart mostly measures that drift.
  // The figure is the median round's.
  const int rounds = quick ? 1 : 3;
  std::map<int64_t, std::vector<double>> ratios;
  for (int i = 0; i < rounds; ++i) {
    const double b1 = step_of(steppers[1]);
    for (int64_t batch : {8, 32}) ratios[batch].push_back(b1 * static_cast<double>(batch) / step_of(steppers[batch]));
  }
  for (auto& [batch, r] : ratios) {
    std::vector<double> sorted = r;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2], goal = batch == 8 ? 5.0 : 12.0;
    emit("decode_batch_scaling",
         name + " batch " + std::to_string(batch) + " decode tokens/s over batch 1, median of " +
             std::to_string(rounds) + " paired rounds, " + threads_label(),
         median, "x", "goal (issue 17)", goal, median / goal, {{"rounds", r}});
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// llama2.c's run.c on this machine (issue 17: stories42M shape, batch 1, one thread, 256 tokens),
// recorded in bench/README.md: the peer of decode_bf16_vs_llama2c without --llama2c.
constexpr double kLlama2cTokensPerS = 179.0;

// --llama2c: karpathy/llama2.c's `run` binary (not part of this repository) and the folder the
// checkpoints and the tokenizer it reads are written to.
struct Llama2cPeer {
  std::string run;
  std::string dir;
};

// Writes a tensor's float32 values to `out`.
void write_floats(std::FILE* out, const at::Tensor& t, const std::string& path) {
  const auto c = t.detach().to(torch::kFloat32).contiguous();
  const auto n = static_cast<size_t>(c.numel());
  if (std::fwrite(c.data_ptr<float>(), sizeof(float), n, out) != n) throw Error("cannot write " + path);
}

// The model as a llama2.c legacy (version 0) checkpoint: the Config header of 7 int32 (a positive
// vocab_size: the classifier is the embedding), then float32 weights in run.c's order: embedding,
// per-layer attention norms, wq, wk, wv, wo, ffn norms, w1 (gate), w2 (down), w3 (up), the final
// norm and the RoPE cos / sin tables (seq_len x head_dim / 2 each). llama2.c rotates the pairs
// (2j, 2j + 1) of a head where Hugging Face's rotate_half pairs (j, j + head_dim / 2), so wq's and
// wk's rows are interleaved per head (llama2.c's export.py does the same to Hugging Face weights).
void write_llama2c_checkpoint(CausalLM& model, const std::string& path) {
  const auto& c = model->config();
  if (!c.tie_word_embeddings || c.num_key_value_heads != c.num_attention_heads)
    throw ValueError("llama2.c checkpoint: needs tied embeddings and as many KV heads as heads: " + path);
  const int64_t heads = c.num_attention_heads, head_dim = c.resolved_head_dim(), dim = c.hidden_size;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!out) throw Error("cannot open " + path + " for writing: " + std::strerror(errno));
  const std::array<int32_t, 7> header{static_cast<int32_t>(dim),
                                      static_cast<int32_t>(c.intermediate_size),
                                      static_cast<int32_t>(c.num_hidden_layers),
                                      static_cast<int32_t>(heads),
                                      static_cast<int32_t>(c.num_key_value_heads),
                                      static_cast<int32_t>(c.vocab_size),
                                      static_cast<int32_t>(c.max_position_embeddings)};
  if (std::fwrite(header.data(), sizeof(int32_t), header.size(), out.get()) != header.size())
    throw Error("cannot write " + path);
  c10::InferenceMode inference;
  auto& layers = model->model->layers;
  auto each_layer = [&](const std::function<at::Tensor(DecoderLayerImpl&)>& weight) {
    for (size_t l = 0; l < layers->size(); ++l) {
      write_floats(out.get(), weight(*layers->ptr<DecoderLayerImpl>(l)), path);
    }
  };
  auto interleaved = [&](const at::Tensor& w) {
    return w.view({heads, 2, head_dim / 2, dim}).transpose(1, 2).reshape({heads * head_dim, dim});
  };
  write_floats(out.get(), model->model->embed_tokens->weight, path);
  each_layer([](DecoderLayerImpl& l) { return l.input_layernorm->weight; });
  each_layer([&](DecoderLayerImpl& l) { return interleaved(l.self_attn->q_proj->weight); });
  each_layer([&](DecoderLayerImpl& l) { return interleaved(l.self_attn->k_proj->weight); });
  each_layer([](DecoderLayerImpl& l) { return l.self_attn->v_proj->weight; });
  each_layer([](DecoderLayerImpl& l) { return l.self_attn->o_proj->weight; });
  each_layer([](DecoderLayerImpl& l) { return l.post_attention_layernorm->weight; });
  each_layer([](DecoderLayerImpl& l) { return l.mlp->gate_proj->weight; });
  each_layer([](DecoderLayerImpl& l) { return l.mlp->down_proj->weight; });
  each_layer([](DecoderLayerImpl& l) { return l.mlp->up_proj->weight; });
  write_floats(out.get(), model->model->norm->weight, path);
  const auto inv_freq =
      1.0 / torch::pow(c.rope_theta, torch::arange(0, head_dim, 2, torch::kFloat64) / static_cast<double>(head_dim));
  const auto angles = torch::arange(c.max_position_embeddings, torch::kFloat64).unsqueeze(1) * inv_freq.unsqueeze(0);
  write_floats(out.get(), torch::cos(angles), path);
  write_floats(out.get(), torch::sin(angles), path);
  if (std::fflush(out.get()) != 0) throw Error("cannot write " + path);
}

// run.c's tokenizer.bin: max_token_length, then per token a float score, an int32 length and the
// bytes. Token i is "[i]" except " " (kLlama2cSpace, the prompt's dummy prefix) and the letters a-z
// (kLlama2cLetters + 0..25): a prompt of letters encodes to [" ", letters...] with no merges, and
// the text run.c prints reads back into ids (parse_llama2c_text).
constexpr int64_t kLlama2cSpace = 259, kLlama2cLetters = 260;

std::string llama2c_piece(int64_t id) {
  if (id == kLlama2cSpace) return " ";
  if (id >= kLlama2cLetters && id < kLlama2cLetters + 26) {
    return std::string(1, static_cast<char>('a' + id - kLlama2cLetters));
  }
  return "[" + std::to_string(id) + "]";
}

void write_llama2c_tokenizer(int64_t vocab_size, const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!out) throw Error("cannot open " + path + " for writing: " + std::strerror(errno));
  const auto max_len = static_cast<int32_t>(llama2c_piece(vocab_size - 1).size());
  bool ok = std::fwrite(&max_len, sizeof(max_len), 1, out.get()) == 1;
  for (int64_t i = 0; i < vocab_size && ok; ++i) {
    const std::string piece = llama2c_piece(i);
    const float score = 0.0F;
    const auto len = static_cast<int32_t>(piece.size());
    ok = std::fwrite(&score, sizeof(score), 1, out.get()) == 1 && std::fwrite(&len, sizeof(len), 1, out.get()) == 1 &&
         std::fwrite(piece.data(), 1, piece.size(), out.get()) == piece.size();
  }
  if (!ok || std::fflush(out.get()) != 0) throw Error("cannot write " + path);
}

// The ids of the text run.c printed (its pieces, the first one's leading space stripped).
std::vector<int64_t> parse_llama2c_text(const std::string& text) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == ' ') {
      ids.push_back(kLlama2cSpace);
    } else if (ch >= 'a' && ch <= 'z') {
      ids.push_back(kLlama2cLetters + (ch - 'a'));
    } else if (ch == '[') {
      const size_t end = text.find(']', i);
      if (end == std::string::npos || end == i + 1 || end - i > 12)
        throw FormatError("llama2.c output: unterminated token at byte " + std::to_string(i));
      for (size_t k = i + 1; k < end; ++k) {
        if (text[k] < '0' || text[k] > '9') {
          throw FormatError("llama2.c output: bad token at byte " + std::to_string(i));
        }
      }
      ids.push_back(std::stoll(text.substr(i + 1, end - i - 1)));
      i = end;
    } else {
      throw FormatError("llama2.c output: unexpected byte " + std::to_string(static_cast<unsigned char>(ch)) + " at " +
                        std::to_string(i));
    }
  }
  return ids;
}

struct Llama2cRun {
  double seconds = 0.0;       // CPU time of the child (wall time with --wall), load included
  double reported_tok_s = 0;  // run.c's own "achieved tok/s" (wall clock, after its first step)
  std::vector<int64_t> ids;   // the ids it printed: the prompt's letters, then the generated ones
};

// One greedy run of llama2.c: `steps` forward passes (BOS, the prompt, then the generated tokens).
Llama2cRun run_llama2c(const Llama2cPeer& peer, const std::string& checkpoint, const std::string& prompt,
                       int64_t steps) {
  const std::string tokenizer = peer.dir + "/hyflow_tokenizer.bin", n = std::to_string(steps);
  std::vector<std::string> args{peer.run, checkpoint, "-z", tokenizer, "-t", "0", "-s", "1", "-n", n, "-i", prompt};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) throw Error(std::string("llama2.c: pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  pid_t pid = 0;
  const double wall0 = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const int spawned = posix_spawn(&pid, peer.run.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (spawned != 0) {
    close(fds[0]);
    throw Error("llama2.c: cannot start " + peer.run + ": " + std::strerror(spawned));
  }
  // Its output is the prompt and the tokens (a few bytes each) and one line: bounded at 1 MiB.
  std::string output;
  char buffer[4096];
  for (ssize_t got = 0; (got = read(fds[0], buffer, sizeof(buffer))) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 || output.size() > (1U << 20U)) break;
    output.append(buffer, static_cast<size_t>(got));
  }
  close(fds[0]);
  int status = 0;
  rusage usage{};
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  const double wall1 = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("llama2.c: " + peer.run + " failed (status " + std::to_string(status) + "): " + output.substr(0, 400));
  const std::string marker = "achieved tok/s:";
  const size_t at = output.rfind(marker);
  if (at == std::string::npos) throw FormatError("llama2.c: no \"" + marker + "\" line in: " + output.substr(0, 400));
  Llama2cRun r;
  r.reported_tok_s = std::strtod(output.c_str() + at + marker.size(), nullptr);
  r.ids = parse_llama2c_text(output.substr(0, at));
  r.seconds = g_wall ? wall1 - wall0
                     : static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                           1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  return r;
}

// Tokens equal up to the first difference, over a's length.
double prefix_agreement(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t t = 0;
  while (t < a.size() && t < b.size() && a[t] == b[t]) ++t;
  return a.empty() ? 0.0 : static_cast<double>(t) / static_cast<double>(a.size());
}

// The bf16 engine (DecodeDtype::kBFloat16, the CPU kernels) against the float32 engine on the same
// model: per batch, rounds that measure the decode step of both back to back (the machine's read
// bandwidth drifts within minutes and other jobs come and go), the figures the median round's.
// The same decode-step measure as bench_shape (runs of new_tokens and new_tokens / 2, the prefill
// cancels). With a llama2.c peer, the batch-1 rounds also time its run.c on the same weights as a
// child process, measured the same way: greedy runs that end at the same positions as the engine's
// long and short runs (prompt_len + new_tokens - 1 forward passes), best of 3 each, the difference
// over new_tokens / 2 (the checkpoint's load and the prompt cancel).
void bench_bf16(const Figures& f, bool quick, const std::optional<Llama2cPeer>& peer) {
  const int64_t prompt_len = 16, new_tokens = quick ? 32 : 128;
  const int rounds = quick ? 3 : 5;
  const DecodeSampling greedy{.sampling = {.greedy = true}};
  const char* build = decode::bf16_dot_enabled() ? "vdpbf16ps" : "portable";
  for (const auto& [name, shape] : {std::pair{std::string("42M"), shape_42m()}, {std::string("110M"), shape_110m()}}) {
    // llama2.c's RMSNorm epsilon (the stories models'), so its run.c computes the same model
    ModelConfig config = shape;
    config.rms_norm_eps = 1e-5;
    torch::manual_seed(0);
    CausalLM model(config);
    for (int64_t batch : {1, 8, 32}) {
      auto ids = torch::randint(3, config.vocab_size, {batch, prompt_len});
      auto requests_of = [&](int64_t tokens) {
        std::vector<DecodeRequest> requests;
        for (int64_t b = 0; b < batch; ++b) {
          std::vector<int64_t> p(static_cast<size_t>(prompt_len));
          for (int64_t t = 0; t < prompt_len; ++t) p[static_cast<size_t>(t)] = ids[b][t].item<int64_t>();
          requests.push_back(DecodeRequest{.prompt = p, .max_new_tokens = tokens, .first_row_id = b});
        }
        return requests;
      };
      const auto long_run = requests_of(new_tokens), short_run = requests_of(new_tokens / 2);
      DecodeEngine fp32(model), bf16(model, DecodeEngineOptions{.dtype = DecodeDtype::kBFloat16});
      // warm-up (packing, the KV pool's first touch) and the tokens of both
      const auto tokens32 = fp32.run(long_run, greedy), tokens16 = bf16.run(long_run, greedy);
      int64_t same = 0, total = 0;
      for (size_t i = 0; i < tokens32.size(); ++i) {
        const auto& a = tokens32[i].tokens;
        const auto& b = tokens16[i].tokens;
        // tokens equal up to the first difference (after it the two continue different texts)
        size_t t = 0;
        while (t < a.size() && t < b.size() && a[t] == b[t]) ++t;
        same += static_cast<int64_t>(t);
        total += static_cast<int64_t>(a.size());
      }
      auto step_of = [&](DecodeEngine& e) {
        return (best_of(3, [&] { e.run(long_run, greedy); }) - best_of(3, [&] { e.run(short_run, greedy); })) /
               static_cast<double>(new_tokens - new_tokens / 2);
      };
      // llama2.c on the same weights (batch 1): the checkpoint, then its greedy tokens on the prompt
      // [BOS, " ", a, b, ...] (prompt_len tokens) against both engines' on the same prompt.
      const bool with_peer = peer.has_value() && batch == 1;
      const std::string checkpoint = with_peer ? peer->dir + "/hyflow_" + name + ".bin" : std::string();
      std::string prompt_text;
      std::vector<int64_t> prompt{1, kLlama2cSpace};
      for (int64_t t = 2; t < prompt_len; ++t) {
        prompt.push_back(kLlama2cLetters + t - 2);
        prompt_text += static_cast<char>('a' + t - 2);
      }
      std::vector<double> reported;
      auto llama2c_run = [&](int64_t tokens) {
        const int64_t steps = prompt_len + tokens - 1;  // the forward passes of the engine's run
        auto r = run_llama2c(*peer, checkpoint, prompt_text, steps);
        // it prints one piece per pass but the first (the stripped " "): the letters, then the tokens
        if (static_cast<int64_t>(r.ids.size()) != steps - 1 ||
            !std::equal(prompt.begin() + 2, prompt.end(), r.ids.begin()))
          throw FormatError("llama2.c printed " + std::to_string(r.ids.size()) + " tokens for " +
                            std::to_string(steps) + " steps (it stops at a generated BOS, id 1), or another prompt");
        return r;
      };
      auto llama2c_step = [&] {
        auto best = [&](int64_t tokens) {
          double b = 1e30;
          for (int i = 0; i < 3; ++i) {
            const auto r = llama2c_run(tokens);
            b = std::min(b, r.seconds);
            if (tokens == new_tokens) reported.push_back(r.reported_tok_s);
          }
          return b;
        };
        return (best(new_tokens) - best(new_tokens / 2)) / static_cast<double>(new_tokens - new_tokens / 2);
      };
      nlohmann::json peer_detail = nlohmann::json::object();
      if (with_peer) {
        write_llama2c_checkpoint(model, checkpoint);
        write_llama2c_tokenizer(config.vocab_size, peer->dir + "/hyflow_tokenizer.bin");
        const auto generated = llama2c_run(new_tokens).ids;
        const std::vector<int64_t> peer_tokens(generated.begin() + (prompt_len - 2), generated.end());
        const std::vector<DecodeRequest> check{DecodeRequest{.prompt = prompt, .max_new_tokens = new_tokens}};
        const auto t32 = fp32.run(check, greedy)[0].tokens, t16 = bf16.run(check, greedy)[0].tokens;
        auto head = [](const std::vector<int64_t>& v) {
          return std::vector<int64_t>(v.begin(), v.begin() + std::min<ptrdiff_t>(8, std::ssize(v)));
        };
        peer_detail = {{"llama2c_greedy_prefix_agreement_fp32", prefix_agreement(t32, peer_tokens)},
                       {"llama2c_greedy_prefix_agreement_bf16", prefix_agreement(t16, peer_tokens)},
                       {"llama2c_first_tokens", head(peer_tokens)},
                       {"fp32_first_tokens", head(t32)}};
      }
      std::vector<double> s32, s16, ratio, speedup_l2, fp32_vs_l2, sl;
      for (int r = 0; r < (batch == 1 ? rounds : std::max(1, rounds - 2)); ++r) {
        s32.push_back(step_of(fp32));
        s16.push_back(step_of(bf16));
        ratio.push_back(s32.back() / s16.back());
        if (!with_peer) continue;
        sl.push_back(llama2c_step());
        speedup_l2.push_back(sl.back() / s16.back());
        fp32_vs_l2.push_back(sl.back() / s32.back());
      }
      const double step32 = median(s32), step16 = median(s16), speedup = median(ratio);
      const auto b = static_cast<double>(batch);
      const std::string c = name + " greedy b" + std::to_string(batch) + " p" + std::to_string(prompt_len) + " +" +
                            std::to_string(new_tokens) + ", decode steps, " + threads_label();
      emit("decode_bf16_tokens_per_s", c + ", bf16 (value) vs float32 engine (peer)", b / step16, "tokens/s",
           "float32 engine", b / step32, speedup,
           {{"kernels", build},
            {"rounds", ratio.size()},
            {"step_ratio_rounds", ratio},
            {"bf16_step_ms", step16 * 1e3},
            {"fp32_step_ms", step32 * 1e3},
            {"greedy_prefix_agreement", static_cast<double>(same) / static_cast<double>(total)},
            {"goal", batch == 32 ? nlohmann::json(1.5) : nlohmann::json()}});
      if (batch != 1) continue;
      // Bytes a batch-1 step reads: the weights and the KV over the mean context, at 2 bytes each (bf16) or
      // 4; the roofline is those bytes at the measured read bandwidth.
      const double mean_context = static_cast<double>(prompt_len) + 0.75 * static_cast<double>(new_tokens);
      const double bytes32 = step_bytes(config, mean_context), bytes16 = bytes32 / 2.0;
      const double roof16 = bytes16 / (f.bandwidth * 1e9);
      emit("decode_bf16_roofline", name + " batch 1 bf16 decode step, " + threads_label(), roof16 / step16,
           "fraction of roofline", "bytes per token / measured read bandwidth (ms)", roof16 * 1e3, roof16 / step16,
           {{"step_ms", step16 * 1e3},
            {"bytes_per_token", bytes16},
            {"fp32_bytes_per_token", bytes32},
            {"fp32_fraction_of_roofline", bytes32 / (f.bandwidth * 1e9) / step32},
            {"bandwidth_gbs", f.bandwidth},
            {"packed_bytes_bf16", bf16.packed_bytes()},
            {"packed_bytes_fp32", fp32.packed_bytes()}});
      if (with_peer) {
        const double step_l2 = median(sl);
        peer_detail.update({{"goal", name == "42M" ? nlohmann::json(1.8) : nlohmann::json()},
                            {"fp32_engine_vs_llama2c", median(fp32_vs_l2)},
                            {"rounds", sl.size()},
                            {"ratio_rounds", speedup_l2},
                            {"llama2c_step_ms", step_l2 * 1e3},
                            {"llama2c_reported_tok_s", median(reported)},
                            {"llama2c_steps", prompt_len + new_tokens - 1}});
        emit("decode_bf16_vs_llama2c",
             c + ", bf16 engine (value) vs llama2.c run.c float32 (peer), measured side by side", 1.0 / step16,
             "tokens/s", "llama2.c run.c (" + peer->run + "), measured side by side, same weights", 1.0 / step_l2,
             median(speedup_l2), peer_detail);
      } else if (name == "42M") {
        emit("decode_bf16_vs_llama2c", c + ", bf16 engine (value) vs llama2.c run.c float32 (peer)", 1.0 / step16,
             "tokens/s", "llama2.c run.c, issue 17's recorded figure (not re-run)", kLlama2cTokensPerS,
             1.0 / step16 / kLlama2cTokensPerS,
             {{"goal", 1.8}, {"fp32_engine_vs_llama2c", 1.0 / step32 / kLlama2cTokensPerS}});
      }
    }
  }
}

void bench_prefix_sharing(bool quick) {
  torch::manual_seed(0);
  CausalLM model(shape_42m());
  const int64_t prompt_len = quick ? 64 : 256;
  std::vector<int64_t> prompt(static_cast<size_t>(prompt_len));
  for (int64_t t = 0; t < prompt_len; ++t) prompt[static_cast<size_t>(t)] = 3 + (t * 7919) % 31000;
  struct Result {
    DecodeStats stats;
    double prefill_s;
  };
  // Prefill time: a run that samples one token per sample (the prompt's pass, then the choice).
  auto run = [&](int64_t n, bool share) {
    DecodeEngine engine(model, DecodeEngineOptions{.share_prefix = share});
    const DecodeSampling sampling{.sampling = {.temperature = 1.0}, .seed = 1};
    DecodeRequest r{.prompt = prompt, .n = n, .max_new_tokens = 1};
    engine.run({r}, sampling);  // warm-up
    const double prefill_s = best_of(2, [&] { engine.run({r}, sampling); });
    r.max_new_tokens = 16;
    engine.run({r}, sampling);
    return Result{engine.stats(), prefill_s};
  };
  const auto one = run(1, true), shared = run(8, true), copied = run(8, false);
  const std::string c = "42M prompt " + std::to_string(prompt_len) + " +16 sampled, n=8";
  emit("prefix_sharing_prefill", c + " shared (value) vs n=1 (peer)", shared.prefill_s * 1e3, "ms", "n=1",
       one.prefill_s * 1e3, one.prefill_s / shared.prefill_s,
       {{"n8_unshared_ms", copied.prefill_s * 1e3},
        {"prefill_tokens_n8", shared.stats.prefill_tokens},
        {"prefill_tokens_n8_unshared", copied.stats.prefill_tokens}});
  const double kb = static_cast<double>(shared.stats.kv_block_bytes) / 1e6;
  emit("prefix_sharing_kv", c + " peak KV MB shared (value) vs n=8 copies (peer)",
       static_cast<double>(shared.stats.peak_kv_blocks) * kb, "MB", "n=8 unshared",
       static_cast<double>(copied.stats.peak_kv_blocks) * kb,
       static_cast<double>(copied.stats.peak_kv_blocks) / static_cast<double>(shared.stats.peak_kv_blocks),
       {{"n1_mb", static_cast<double>(one.stats.peak_kv_blocks) * kb}});
}

void bench_continuous(bool quick) {
  torch::manual_seed(0);
  CausalLM model(shape_42m());
  const int64_t requests_n = 32, slots = 8, prompt_len = 16, short_len = quick ? 8 : 16;
  std::vector<DecodeRequest> requests;
  auto ids = torch::randint(3, 32000, {requests_n, prompt_len});
  double useful = 0.0;
  for (int64_t i = 0; i < requests_n; ++i) {
    std::vector<int64_t> p(static_cast<size_t>(prompt_len));
    for (int64_t t = 0; t < prompt_len; ++t) p[static_cast<size_t>(t)] = ids[i][t].item<int64_t>();
    // lengths short_len .. 10 * short_len, spread over the requests
    const int64_t len = short_len + (i * 37 % requests_n) * (9 * short_len) / (requests_n - 1);
    requests.push_back(DecodeRequest{.prompt = p, .max_new_tokens = len, .first_row_id = i});
    useful += static_cast<double>(len);
  }
  DecodeSampling greedy{.sampling = {.greedy = true}};
  DecodeEngine engine(model, DecodeEngineOptions{.max_batch = slots});
  engine.run(requests, greedy);  // warm-up
  const double continuous_s = seconds([&] { engine.run(requests, greedy); });
  // Static batches of `slots` with the engine: each batch runs until its longest finishes.
  const double static_engine_s = seconds([&] {
    for (int64_t b = 0; b < requests_n; b += slots) {
      engine.run(std::vector<DecodeRequest>(requests.begin() + b, requests.begin() + b + slots), greedy);
    }
  });
  // Today's generate(): static batches padded to the longest response of the batch.
  const double reference_s = seconds([&] {
    for (int64_t b = 0; b < requests_n; b += slots) {
      int64_t longest = 0;
      for (int64_t i = b; i < b + slots; ++i)
        longest = std::max(longest, requests[static_cast<size_t>(i)].max_new_tokens);
      generate(model,
               DataProto(TensorDict{{"input_ids", ids.narrow(0, b, slots)},
                                    {"attention_mask", torch::ones({slots, prompt_len}, torch::kLong)}}),
               GenerationOptions{.max_new_tokens = longest, .do_sample = false});
    }
  });
  const std::string c = "42M, 32 prompts, responses " + std::to_string(short_len) + ".." +
                        std::to_string(10 * short_len) + " tokens, 8 slots, useful tokens/s";
  emit("continuous_batching", c, useful / continuous_s, "tokens/s", "reference generate() static batches of 8",
       useful / reference_s, reference_s / continuous_s,
       {{"engine_static_batches_tokens_per_s", useful / static_engine_s}});
}

// The engine's GEMM against oneDNN's inner product on the same (pre-packed) weight, for the
// 42M classifier shape (32000 x 512) at the batch sizes of the decode figures.
void bench_gemm() {
  c10::InferenceMode inference;
  const int64_t in = 512, out = 32000;
  auto w = torch::randn({out, in}) * 0.02;
  auto packed = cuda::pack_onednn_weight(w);
  std::vector<float> ours_packed(static_cast<size_t>(decode::packed_size(in, out)));
  const double pack_s = best_of(3, [&] { decode::pack_weight(w.data_ptr<float>(), in, out, ours_packed.data()); });
  std::vector<decode::Isa> builds{decode::best_kernel_isa()};
  if (decode::best_kernel_isa() == decode::Isa::kAvx512) builds.push_back(decode::Isa::kAvx2);
  for (auto isa : builds) {
    decode::limit_kernel_isa(isa);
    for (int64_t m : {1, 8, 32}) {
      auto x = torch::randn({m, in});
      auto y = torch::empty({m, out});
      auto ours = [&] {
        decode::linear(x.data_ptr<float>(), in, m, ours_packed.data(), nullptr, in, out, y.data_ptr<float>(), out,
                       false);
      };
      auto theirs = [&] { cuda::onednn_linear_packed(x, packed, {}); };
      ours();
      theirs();
      double a = 1e30, b = 1e30;
      for (int i = 0; i < 5; ++i) {  // alternate, so both see the same machine load
        a = std::min(a, seconds(ours));
        b = std::min(b, seconds(theirs));
      }
      const double flops = 2.0 * static_cast<double>(m * in * out);
      emit("decode_gemm", "x (" + std::to_string(m) + ", 512) W^T, W 32000 x 512", flops / a / 1e9, "GFLOP/s",
           "oneDNN inner product, weight pre-packed", flops / b / 1e9, b / a,
           {{"kernels", decode::isa_name(isa)},
            {"weight_gbs", 4.0 * static_cast<double>(in * out) / a / 1e9},
            {"pack_ms", pack_s * 1e3}});
    }
  }
  decode::limit_kernel_isa(decode::Isa::kAvx512);
}

// Requests of `batch` random prompts of prompt_len tokens, max_new_tokens each, no EOS.
std::vector<DecodeRequest> greedy_requests(int64_t batch, int64_t prompt_len, int64_t new_tokens, int64_t vocab) {
  std::vector<DecodeRequest> requests;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> p(static_cast<size_t>(prompt_len));
    for (int64_t t = 0; t < prompt_len; ++t) p[static_cast<size_t>(t)] = 3 + (b * 7919 + t * 104729) % (vocab - 3);
    requests.push_back(DecodeRequest{.prompt = p, .max_new_tokens = new_tokens, .first_row_id = b});
  }
  return requests;
}

// The ATen backend (the device path) against the CPU kernels on the 42M shape, CPU tensors:
// what the portable path costs where the kernels exist (its linears run on LibTorch's BLAS).
void bench_aten_cpu(bool quick) {
  torch::manual_seed(0);
  CausalLM model(shape_42m());
  const int64_t prompt_len = 16, new_tokens = quick ? 8 : 16;
  for (int64_t batch : {1, 8, 32}) {
    const auto requests = greedy_requests(batch, prompt_len, new_tokens, model->config().vocab_size);
    const DecodeSampling greedy{.sampling = {.greedy = true}};
    DecodeEngine kernels(model), aten(model, {.backend = DecodeBackend::kAten});
    std::vector<DecodeOutput> a, k;
    kernels.run(requests, greedy);  // warm-up: packing, the KV pool's first touch
    aten.run(requests, greedy);
    const double kernels_s = seconds([&] { k = kernels.run(requests, greedy); });
    const double aten_s = seconds([&] { a = aten.run(requests, greedy); });
    bool identical = a.size() == k.size();
    for (size_t i = 0; identical && i < a.size(); ++i) identical = a[i].tokens == k[i].tokens;
    const double tokens = static_cast<double>(batch * new_tokens);
    emit("decode_aten_cpu",
         "42M greedy b" + std::to_string(batch) + " p16 +" + std::to_string(new_tokens) + ", ATen backend on CPU",
         tokens / aten_s, "tokens/s", "the engine's CPU kernels", tokens / kernels_s, kernels_s / aten_s,
         {{"tokens_identical", identical}});
  }
}

// Qwen2-0.5B's shape (Qwen2.5-0.5B's config.json), random weights.
ModelConfig shape_qwen2_0_5b() {
  return ModelConfig{.architecture = "Qwen2ForCausalLM",
                     .vocab_size = 151936,
                     .hidden_size = 896,
                     .intermediate_size = 4864,
                     .num_hidden_layers = 24,
                     .num_attention_heads = 14,
                     .num_key_value_heads = 2,
                     .max_position_embeddings = 32768,
                     .rms_norm_eps = 1e-6,
                     .rope_theta = 1000000.0,
                     .qkv_bias = true,
                     .tie_word_embeddings = true};
}

// The first interpreter that imports torch with CUDA: the peer must run on the same device.
std::string torch_python() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    const std::string probe =
        std::string(py) + " -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null";
    if (std::system(probe.c_str()) == 0) return py;
  }
  return {};
}

// The peer's tokens/s at `batch` (peer_torch.py --device cuda), or -1 when it cannot run.
double peer_device_tokens_per_s(const std::string& python, int64_t batch, int64_t prompt_len, int64_t new_tokens) {
  if (python.empty()) return -1.0;
  const std::string cmd = python + " " + HYFLOW_MODELS_PEER_SCRIPT + " --case qwen2_0_5b --device cuda --dtype bf16" +
                          " --only generate --repeats 2 --gen-batch " + std::to_string(batch) + " --prompt-len " +
                          std::to_string(prompt_len) + " --new-tokens " + std::to_string(new_tokens);
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1.0;
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  if (pclose(pipe) != 0) return -1.0;
  const auto line = nlohmann::json::parse(out.substr(0, out.find('\n')), nullptr, false);
  return line.is_object() && line.contains("tokens_per_s") ? line["tokens_per_s"].get<double>() : -1.0;
}

// Decode on cuda:0: the engine's ATen backend on a bf16 Qwen2-0.5B-shaped model against a
// PyTorch eager KV-cache loop on the same device, and the step time against the HBM roofline
// (weight bytes per step / the bandwidth of a large device copy measured in this run).
void bench_device(bool quick) {
  if (!torch::cuda::is_available()) {
    std::cout << nlohmann::json{{"bench", "decode_device"},
                                {"case", "Qwen2-0.5B shape bf16 on cuda:0"},
                                {"skipped", "no CUDA device visible: the device figures were not measured"}}
                     .dump()
              << std::endl;
    return;
  }
  g_wall = true;  // device work is not the process's CPU time
  const auto device = c10::Device(c10::kCUDA, 0);
  const auto sync = [] { torch::cuda::synchronize(); };
  // Device bandwidth: a 1 GiB device-to-device copy reads and writes every byte.
  double bandwidth = 0.0;
  {
    auto a = torch::empty({int64_t{1} << 28}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    auto b = torch::empty_like(a);
    b.copy_(a);
    sync();
    const double s = best_of(5, [&] {
      b.copy_(a);
      sync();
    });
    bandwidth = 2.0 * static_cast<double>(a.nbytes()) / s / 1e9;
    emit("decode_device_bandwidth", "cuda:0 copy of 1 GiB (read + write)", bandwidth, "GB/s", "none", 0.0, 1.0);
  }
  torch::manual_seed(0);
  const auto config = shape_qwen2_0_5b();
  CausalLM model(config);
  model->to(device, torch::kBFloat16);
  const double weight_bytes = 2.0 * static_cast<double>(config.num_parameters());  // tied head read once
  const std::string python = torch_python();
  const int64_t prompt_len = 16, new_tokens = quick ? 32 : 128;
  for (int64_t batch : {1, 8, 32}) {
    const auto long_run = greedy_requests(batch, prompt_len, new_tokens, config.vocab_size);
    const auto short_run = greedy_requests(batch, prompt_len, new_tokens / 2, config.vocab_size);
    const DecodeSampling greedy{.sampling = {.greedy = true}};
    DecodeEngine engine(model);
    engine.run(long_run, greedy);  // warm-up: the KV pool, the caching allocator
    sync();
    const double step_s = (seconds([&] {
                             engine.run(long_run, greedy);
                             sync();
                           }) -
                           seconds([&] {
                             engine.run(short_run, greedy);
                             sync();
                           })) /
                          static_cast<double>(new_tokens - new_tokens / 2);
    const double whole_s = seconds([&] {
      engine.run(long_run, greedy);
      sync();
    });
    const double tokens = static_cast<double>(batch * new_tokens);
    const double peer = peer_device_tokens_per_s(python, batch, prompt_len, new_tokens);
    const std::string c =
        "Qwen2-0.5B shape bf16 cuda:0 greedy b" + std::to_string(batch) + " p16 +" + std::to_string(new_tokens);
    emit("decode_device_tokens_per_s", c, tokens / whole_s, "tokens/s", "PyTorch eager KV-cache loop (peer_torch.py)",
         peer, peer > 0 ? tokens / whole_s / peer : 0.0, {{"peer_ran", peer > 0}, {"step_ms", step_s * 1e3}});
    if (batch == 1) {
      const double roof_s = weight_bytes / (bandwidth * 1e9);
      emit("decode_device_roofline", "Qwen2-0.5B shape bf16 cuda:0 batch 1 decode step", roof_s / step_s,
           "fraction of roofline", "weight bytes per step / measured copy bandwidth (ms)", roof_s * 1e3,
           roof_s / step_s,
           {{"step_ms", step_s * 1e3}, {"weight_mb", weight_bytes / 1e6}, {"bandwidth_gbs", bandwidth}});
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  bool quick = false;
  std::string only;
  std::optional<Llama2cPeer> peer;
  std::string peer_dir = "/tmp";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--wall") {
      g_wall = true;
    } else if (a == "--case" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--llama2c" && i + 1 < argc) {
      peer = Llama2cPeer{.run = argv[++i], .dir = {}};
    } else if (a == "--llama2c-dir" && i + 1 < argc) {
      peer_dir = argv[++i];
    } else {
      std::cerr
          << "usage: decode_bench [--threads N] [--quick] [--wall] [--case gemm|42m|110m|scaling|aten|device|bf16]"
             " [--llama2c RUN [--llama2c-dir DIR]]\n";
      return 2;
    }
  }
  if (peer) {
    if (only != "bf16") {
      std::cerr << "decode_bench: --llama2c goes with --case bf16\n";
      return 2;
    }
    peer->dir = peer_dir;
  }
  torch::set_num_threads(threads);
  // Process CPU time adds up every thread's: past one thread only wall time says how long a step took.
  if (threads > 1) g_wall = true;
  if (only == "device") {
    bench_device(quick);
    return 0;
  }
  if (only == "aten") {
    bench_aten_cpu(quick);
    return 0;
  }
  Figures f{};
  nlohmann::json detail = nlohmann::json::object();
  f.bandwidth = read_bandwidth_gbs(detail);
  const double copy = copy_bandwidth_gbs();
  emit("memory_bandwidth", "read, best of 256 MiB / 1 GiB x 1 / 4 streams / 8 streams fetched ahead into L2, " +
                               threads_label(),
       f.bandwidth, "GB/s",
       "memcpy 512 MiB (read+write)", copy, f.bandwidth / copy, detail);
  {
    c10::InferenceMode inference;
    const int64_t n = 2048;
    auto a = torch::randn({n, n}), b = torch::randn({n, n});
    const double flops = 2.0 * static_cast<double>(n * n * n);
    torch::mm(a, b);
    f.sgemm_mm = flops / best_of(2, [&] { torch::mm(a, b); }) / 1e9;
    cuda::onednn_linear(a, b);
    f.sgemm_onednn = flops / best_of(3, [&] { cuda::onednn_linear(a, b); }) / 1e9;
    emit("sgemm", "2048^3 float32, " + std::to_string(threads) + " thread(s)", f.sgemm_onednn, "GFLOP/s",
         "torch::mm (LibTorch's BLAS)", f.sgemm_mm, f.sgemm_onednn / f.sgemm_mm);
  }
  if (only == "gemm") {
    bench_gemm();
    return 0;
  }
  if (only == "bf16") {
    bench_bf16(f, quick, peer);
    return 0;
  }
  if (only.empty()) bench_gemm();
  const bool scaling = only == "scaling";
  if (only.empty() || only == "42m" || scaling) bench_shape("42M", shape_42m(), f, quick, scaling);
  if (only.empty() || only == "110m" || scaling) bench_shape("110M", shape_110m(), f, quick, scaling);
  if (only.empty() || only == "42m") {
    bench_prefix_sharing(quick);
    bench_continuous(quick);
  }
  if (only.empty()) {
    bench_aten_cpu(quick);
    bench_device(quick);
  }
  return 0;
}
