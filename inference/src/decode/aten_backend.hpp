#pragma once
// Internal: the decode engine's second forward, written with ATen ops on the model's own
// device and dtype (CUDA, bf16/fp16, and float32 CPU for the tests). It serves the same
// scheduler as the CPU kernels (engine.cpp): rows in, logits of the rows that sample out, a
// paged KV pool that is one device tensor, block tables sent once per pass. Per pass there is
// one host-to-device copy (every row's token, position, cache slot, context length and block
// table in one int64 buffer) and per token choice one device-to-host copy (the tokens and their
// log-probs together): the scheduler's stop check.

#include <hyflow/inference/decode_engine.hpp>
#include <hyflow/models/llama.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hyflow::inference::decode {

/// One row of a pass: a token of one sequence, the cache index it is written at (its context is
/// indices 0..index), its rotary position, the sequence's block table.
struct AtenRow {
  int64_t token = 0, position = 0, index = 0;
  const int32_t* blocks = nullptr;
  int64_t n_blocks = 0;
  bool logits = false;
};

/// A token to choose from a row of the last pass's logits.
struct AtenPick {
  int64_t logits_row = 0, step = 0, row_id = 0;
};

class AtenBackend {
 public:
  /// attention_chunk_elements: most key elements one layer gathers at once (DecodeEngineOptions).
  /// bf16 (DecodeDtype::kBFloat16): the forward runs on a bf16 copy of the model's parameters (the
  /// model's own when they are bf16), its KV pool is bf16 and the logits are float32.
  AtenBackend(models::CausalLM model, int64_t block_size, int64_t attention_chunk_elements, bool bf16 = false);

  /// Whether the model can run here: every parameter floating point, contiguous, on one device.
  static bool supports(const models::CausalLM& model);

  /// Makes room for `blocks` KV blocks (kept between runs; grown, or remade when it holds more
  /// than `most` blocks) and rotary positions up to max_pos. Returns the blocks the pool holds.
  int64_t prepare(int64_t blocks, int64_t most, int64_t max_pos);
  /// Casts the parameters that changed since the last call (another tensor, data pointer or version
  /// counter) into the bf16 copy; returns how many. 0 without a copy (the model runs in its own dtype).
  int64_t refresh_weights();
  /// Forgets what was cast: the next refresh_weights() casts every parameter.
  void drop_weights();
  /// Bytes of the bf16 copy of the parameters (0 without one).
  int64_t cast_bytes() const;
  /// Releases the pool, the rotary tables and the last logits; prepare() makes them again.
  void release();
  /// Bytes of one block: keys and values of every layer.
  int64_t kv_block_bytes() const;
  /// Bytes of the pool held.
  int64_t pool_bytes() const;
  /// The largest key gather of one layer since the last reset, in elements (values gather as many).
  int64_t peak_gather_elements() const { return peak_gather_; }
  void reset_peak_gather() { peak_gather_ = 0; }

  /// One forward pass; keeps the logits of the rows with `logits` set, in row order.
  void forward(const std::vector<AtenRow>& rows);
  /// The token of each pick and (with sampling.return_log_probs) its log-prob under
  /// logits / temperature (temperature 1 when greedy), copied to the host in one transfer.
  void choose(const std::vector<AtenPick>& picks, const DecodeSampling& sampling, std::vector<int64_t>& tokens,
              std::vector<float>& log_probs);
  /// Copies the first `count` positions of block `from` into block `to`, every layer.
  void copy_positions(int32_t from, int32_t to, int64_t count);

 private:
  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) const;
  at::Tensor linear(const at::Tensor& x, const torch::nn::Linear& layer) const;

  // A parameter of the source and what its cast copy was made from (DecodeEngine's PackedWeight rule).
  struct CastSource {
    at::Tensor source;
    const void* data = nullptr;
    int64_t version = -1;
  };
  models::CausalLM model_;  // the model the forward runs: the source, or its bf16 copy
  models::CausalLM source_;
  bool cast_ = false;  // model_ is a bf16 copy of source_
  bool float_logits_ = false;
  std::vector<CastSource> cast_from_;
  int64_t block_size_;
  int64_t chunk_elements_;
  int64_t peak_gather_ = 0;
  int64_t layers_, heads_, kv_heads_, head_dim_;
  double eps_;
  at::TensorOptions options_;  // the parameters' device and dtype
  at::Tensor kv_;              // (layers, 2, blocks * block_size, kv_heads, head_dim)
  int64_t blocks_ = 0;
  at::Tensor cos_, sin_;  // (positions, head_dim) in the model's dtype
  at::Tensor logits_;     // (rows with logits, vocab) of the last pass
};

}  // namespace hyflow::inference::decode
