#pragma once
// Batched generation with a KV cache. Input: a DataProto of left-padded prompts
// (input_ids, attention_mask, optional position_ids). Output: verl's rollout batch.

#include <hyflow/cuda/sampling.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/inference/decode_engine.hpp>
#include <hyflow/models/llama.hpp>

#include <cstdint>
#include <vector>

namespace hyflow::inference {

/// Which implementation generate() runs.
enum class GenerationEngine {
  kReference,  ///< the model's own forward on a KVCache, sampling from an at::Generator seeded with `seed`
  /// DecodeEngine (decode_engine.hpp): float32 CPU models on its CPU kernels, other dtypes and
  /// devices (CUDA, bf16) on its ATen backend (GenerationOptions::decode.backend chooses). Greedy
  /// tokens as kReference, log-probs to float32 rounding; sampled tokens are keyed by (seed, row,
  /// step) (cuda::sample_seeded), so they are reproducible for a seed but are not kReference's.
  /// Prompts whose last column is padding run kReference. The rollout is on the prompts' device.
  kDecode,
};

struct GenerationOptions {
  int64_t max_new_tokens = 32;         ///< response length R (responses are right-padded to R)
  int64_t n = 1;                       ///< samples per prompt, interleaved (a, a, b, b)
  bool do_sample = true;               ///< false: greedy (verl's val_kwargs)
  cuda::SamplingOptions sampling;      ///< temperature / top-k / top-p / min-p
  std::vector<int64_t> eos_token_ids;  ///< empty: the model config's eos ids
  int64_t pad_token_id = -1;           ///< -1: the model config's resolved pad id
  uint64_t seed = 0;                   ///< sampling is deterministic for a seed
  bool return_log_probs = false;       ///< add rollout_log_probs (B*n, R)
  GenerationEngine engine = GenerationEngine::kReference;
  DecodeEngineOptions decode;  ///< scheduling of GenerationEngine::kDecode
};

/// Generates responses for every prompt row. Returns a DataProto with
///   prompts (B*n, P), responses (B*n, R), input_ids (B*n, P+R),
///   attention_mask (B*n, P+R) (prompt mask, then 1 up to and including EOS),
///   position_ids (B*n, P+R) (prompt positions continued by 1, 2, ... R),
///   response_mask (B*n, R) (1 up to and including EOS, 0 after),
///   rollout_log_probs (B*n, R) float32 when asked: log softmax(logits / temperature) of the
///   chosen token (temperature 1 for greedy), 0 on padding.
/// Non-tensor columns of `prompts` are repeated with the rows; meta_info is copied.
/// Finished rows emit pad_token_id. Greedy decoding is deterministic; sampling is
/// deterministic for options.seed.
DataProto generate(models::CausalLM& model, const DataProto& prompts, const GenerationOptions& options);

/// generate() with a long-lived DecodeEngine: where GenerationEngine::kDecode applies, `engine`
/// runs the rollout (its own DecodeEngineOptions; options.decode is not used), so the packed
/// weights, the KV pool and the scratch buffers of earlier calls are reused and only the weights
/// that changed since its last run are repacked (decode_engine.hpp: writes that bypass ATen need
/// engine.drop_packed_weights() first). `engine` must have been built on `model`. The output is the
/// one a fresh engine gives, bit for bit. Elsewhere (kReference, or prompts kDecode does not take)
/// this is generate(model, prompts, options) and the engine is not touched.
DataProto generate(models::CausalLM& model, const DataProto& prompts, const GenerationOptions& options,
                   DecodeEngine& engine);

}  // namespace hyflow::inference
