#pragma once
// The rollout's decode engine: a CausalLM forward for generation written on raw float32
// pointers, with a packed copy of each linear weight (refreshed at the start of a run when the
// parameter changed: the trainer updates the weights between runs), a small-batch GEMM that
// reads every weight once per step for the whole batch, fused norms / rotary / SwiGLU / residual adds, a paged (block)
// KV cache, continuous batching (a finished sequence leaves the batch and a queued prompt takes its slot in the next
// step) and prefix sharing (the n samples of a prompt share its prefill and its full KV blocks). generate() runs it
// with GenerationOptions::engine = kDecode.

#include <hyflow/cuda/sampling.hpp>
#include <hyflow/models/llama.hpp>

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace hyflow::inference {

/// Which forward a DecodeEngine runs under its scheduler.
enum class DecodeBackend {
  kAuto,     ///< kKernels when the model allows it (float32, contiguous, CPU), else kAten
  kKernels,  ///< packed float32 weights and the CPU GEMM / attention kernels (inference/src/decode/kernels.hpp)
  kAten,     ///< ATen ops on the model's own device and dtype: CUDA, bf16 / fp16, and CPU
};

/// The precision a DecodeEngine computes in (docs/inference.md, "bf16").
enum class DecodeDtype {
  kModel,     ///< the model's own: float32 or bf16 on the CPU kernels, the parameters' dtype on ATen
  kBFloat16,  ///< bf16 weights (CPU kernels: packed bf16, vdpbf16ps where the CPU has it; ATen: a bf16 copy of
              ///< the parameters and a bf16 KV pool), float32 sums, norms, softmax, residual stream and logits
};

/// Free and total bytes of a device's memory (cudaMemGetInfo's pair).
struct DeviceMemory {
  int64_t free = 0;
  int64_t total = 0;
};

/// What a DecodeEngine asks about a device's memory when it sizes its KV pool.
using DeviceMemoryFn = std::function<DeviceMemory(const c10::Device&)>;

/// The CUDA runtime's figures for `device`, after LibTorch's cached free blocks went back to the
/// driver (vLLM's empty_cache before profiling). Throws hyflow::Error in a build without a CUDA LibTorch.
DeviceMemory cuda_device_memory(const c10::Device& device);

/// vLLM's KV cache budget: gpu_memory_utilization x total minus the memory in use (total - free),
/// counting `held` bytes (the engine's own pool, released before the new one is made) as free.
/// Throws ValueError naming the figures when utilization is outside (0, 1] or nothing is left.
int64_t kv_budget_bytes(double gpu_memory_utilization, const DeviceMemory& memory, int64_t held = 0);

/// Scheduling and memory settings of a DecodeEngine. The KV pool holds, per run, the fewest blocks
/// of: max_batch sequences of the run's longest request, every request at once, and the byte budget
/// (kv_cache_bytes and / or gpu_memory_utilization); a request is admitted only when the blocks
/// its samples can reach (prompt + max_new_tokens each, shared prompt blocks once) are free, and
/// one that could never fit is a ValueError naming the sizes (docs/inference.md, "KV pool").
struct DecodeEngineOptions {
  int64_t max_batch = 0;              ///< most sequences decoding at once (verl's max_num_seqs); 0: no cap
  int64_t block_size = 16;            ///< KV cache positions per block
  bool share_prefix = true;           ///< the n samples of a prompt share its prefill and its full KV blocks
  int64_t max_prefill_tokens = 1024;  ///< prompt tokens admitted per step (at least one prompt)
  DecodeBackend backend = DecodeBackend::kAuto;
  /// kBFloat16 on a float32 model: the weights are copied in bf16 once per weight version (packed at the
  /// start of a run, like the float32 packing) and sampling reads float32 logits.
  DecodeDtype dtype = DecodeDtype::kModel;
  int64_t kv_cache_bytes = 0;  ///< most bytes of the KV pool, any device; 0: no cap of its own
  /// > 0: the pool also fits in kv_budget_bytes(this, memory_info(device), pool held) (vLLM's
  /// rule), measured when the pool is sized. Applies where memory_info answers: CUDA models by
  /// default; ignored on the CPU (no memory_info), where kv_cache_bytes and max_batch size it.
  double gpu_memory_utilization = 0.0;
  DeviceMemoryFn memory_info;  ///< null: cuda_device_memory for CUDA models, none for CPU models
  /// ATen backend: most key elements gathered at once per layer (values likewise). A pass whose
  /// rows x context x kv heads x head_dim exceeds it attends chunk by chunk of whole blocks with an
  /// online softmax; below it, one gather and one softmax as before.
  int64_t attention_chunk_elements = int64_t{1} << 24;
};

/// One prompt and its samples.
struct DecodeRequest {
  std::vector<int64_t> prompt;     ///< token ids, no padding (at least one)
  std::vector<int64_t> positions;  ///< rotary position of each prompt token; empty: 0, 1, ...
  int64_t n = 1;                   ///< samples; sample j has row id first_row_id + j
  int64_t max_new_tokens = 32;
  int64_t first_row_id = 0;
  /// The sampling step of the first new token: a request resumed after k tokens of an earlier run
  /// (prompt + those tokens, first_step = k) draws the seeded tokens the uninterrupted run would.
  int64_t first_step = 0;
  /// > 0: the hooks' on_top_logprobs gets this many most likely tokens of each chosen one (with
  /// return_log_probs; the CPU kernels backend only, ValueError under ATen).
  int64_t top_logprobs = 0;
  /// Set: this request's samples are chosen with these settings (and seed) instead of the run's
  /// DecodeSampling::sampling (and seed), so requests with other temperatures, top-k / top-p /
  /// min-p or seeds share one batch; each decodes as in a run of its own with those settings.
  std::optional<cuda::SamplingOptions> sampling;
  std::optional<uint64_t> seed;
};

/// A token and its log-prob: one of the most likely alternatives at a step (DecodeRequest::top_logprobs).
struct TokenLogProb {
  int64_t token = 0;
  float log_prob = 0.0F;
};

/// How tokens are chosen.
struct DecodeSampling {
  cuda::SamplingOptions sampling;      ///< greedy or temperature / top-k / top-p / min-p
  uint64_t seed = 0;                   ///< sampled tokens depend on (seed, row id, step) only
  std::vector<int64_t> eos_token_ids;  ///< a sample stops after emitting one of these
  bool return_log_probs = false;       ///< log softmax(logits / temperature) of each token
};

/// The tokens of one sample (up to and including EOS) and, when asked, their log-probs.
struct DecodeOutput {
  std::vector<int64_t> tokens;
  std::vector<float> log_probs;
};

/// The step-level side of DecodeEngine::run, for a caller that serves many clients from one run
/// (continuous batching across requests: a request handed over by `admit` joins at the next step).
/// A run with hooks ends when nothing is queued or running after `admit` was asked.
struct DecodeHooks {
  /// > 0: the KV pool and rotary tables are sized for options.max_batch (which must be > 0)
  /// sequences of this many positions, so that requests admitted later fit; every request of the
  /// run must then keep prompt + max_new_tokens (and its last position + max_new_tokens) below it
  /// and n <= max_batch (ValueError naming the request otherwise). Needed for `admit`.
  int64_t reserve_positions = 0;
  /// Asked before every step; the requests it returns join the queue, their outputs after the
  /// earlier ones' (request order, then sample order).
  std::function<std::vector<DecodeRequest>()> admit;
  /// Called once per chosen token with its output index, id and log-prob (0 unless
  /// return_log_probs). Returning false ends that sample at once (a cancelled stream, a stop
  /// string): it leaves the batch and its KV blocks are free for the next step.
  std::function<bool(int64_t output, int64_t token, float log_prob)> on_token;
  /// For a request with top_logprobs k > 0: called just before on_token with that step's k most
  /// likely tokens, most likely first (lower id first on ties), their log-probs from the same
  /// log softmax(logits / temperature) as the chosen token's.
  std::function<void(int64_t output, const std::vector<TokenLogProb>& top)> on_top_logprobs;
  /// Asked before every step (before `admit`); true ends the run at once: samples still running
  /// or queued stay unfinished, their outputs holding the tokens chosen so far (a weight update
  /// that pauses and resumes requests: verl's partial rollout).
  std::function<bool()> pause;
};

/// What the last run did (for benchmarks and tests).
struct DecodeStats {
  int64_t steps = 0;           ///< forward passes
  int64_t prefill_tokens = 0;  ///< prompt tokens run through the model
  int64_t decode_tokens = 0;   ///< sampled tokens fed back
  int64_t peak_kv_blocks = 0;  ///< most KV blocks in use at once
  int64_t kv_block_bytes = 0;  ///< bytes of one block (keys and values of every layer)
  int64_t kv_pool_blocks = 0;  ///< blocks the pool held for the run
  int64_t kv_pool_budget = 0;  ///< the byte budget the pool was sized against (0: none)
  int64_t attention_gather_elements = 0;  ///< ATen backend: the largest key gather of one layer, in elements
  double prefill_s = 0.0;      ///< time in steps that ran prompt tokens
  double decode_s = 0.0;       ///< time in steps that ran only sampled tokens
  int64_t packed_weights = 0;  ///< linear weights (re)packed at the start of the run (changed since the last)
  double pack_s = 0.0;         ///< time spent checking and packing them
};

/// Decodes requests on a CausalLM. Two forwards serve the same scheduler (DecodeBackend): the
/// CPU kernels on float32 or bf16 CPU parameters, and ATen ops on the model's device and dtype (CUDA,
/// bf16 / fp16), whose per-pass work stays on the device and whose only read back per step is
/// the chosen tokens (with their log-probs) for the stop check. With the kernels the engine
/// holds a packed copy of every linear weight (as much memory again as those weights) and checks
/// at the start of each run() whether a parameter changed: another tensor, another data pointer or shape, or a
/// bumped version counter (every ATen in-place op bumps it: optimizer steps, copy_,
/// load_state_dict); changed weights are repacked. Writes that bypass ATen (memcpy into
/// data_ptr, collectives writing raw storage) bump nothing: call drop_packed_weights() after
/// them. The parameters must not change during a run. Greedy tokens equal generate()'s
/// reference path up to the summation order of the products (see docs/inference.md, "Decode
/// engine": logits agree to float32 rounding).
class DecodeEngine {
 public:
  explicit DecodeEngine(models::CausalLM& model, DecodeEngineOptions options = {});
  ~DecodeEngine();
  DecodeEngine(DecodeEngine&&) noexcept;
  DecodeEngine& operator=(DecodeEngine&&) noexcept;

  /// Whether the model can run here: floating-point contiguous parameters of one dtype on one device.
  static bool supports(const models::CausalLM& model);
  /// Whether the CPU kernels can run it: contiguous CPU parameters, all float32 or all bf16 (a bf16 model
  /// runs the kernels' bf16 path: its weights packed as bf16 exactly, its embedding, norms and biases
  /// widened to float32).
  static bool kernels_support(const models::CausalLM& model);
  /// The backend this engine runs (kAuto resolved).
  DecodeBackend backend() const;

  /// Runs every request to completion; outputs are in request order, then sample order.
  std::vector<DecodeOutput> run(const std::vector<DecodeRequest>& requests, const DecodeSampling& sampling);
  /// run() with hooks: requests joining mid-run, tokens as they are chosen, samples cancelled.
  std::vector<DecodeOutput> run(std::vector<DecodeRequest> requests, const DecodeSampling& sampling,
                                const DecodeHooks& hooks);

  /// Forgets the packed weights: the next run() packs every weight again.
  void drop_packed_weights();
  /// Bytes of the packed weight copies held between runs.
  int64_t packed_bytes() const;
  /// verl's free_cache_engine: releases the KV pool, the scratch buffers and the rotary tables
  /// (the packed weights stay: drop_packed_weights); the next run() makes them again.
  void free_cache();
  /// Bytes of the KV pool held between runs (0 after free_cache()).
  int64_t kv_pool_bytes() const;

  const DecodeStats& stats() const { return stats_; }
  const DecodeEngineOptions& options() const { return options_; }

 private:
  models::CausalLM model_;
  DecodeEngineOptions options_;
  DecodeStats stats_;
  struct State;  // KV pool, scratch buffers and rotary tables, kept between runs
  std::unique_ptr<State> state_;
};

}  // namespace hyflow::inference
