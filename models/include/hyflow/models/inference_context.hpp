#pragma once
// The state of one generation pass over a model: the KV cache and the linear weights packed
// for oneDNN. inference::generate() makes one per call and hands it to every forward; a caller
// that decodes step by step does the same. It belongs to hyflow::models, not hyflow::inference,
// because the model's forwards read and write it (inference links models, never the reverse).

#include <hyflow/models/kv_cache.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace hyflow::models {

struct ModelConfig;

/// Per-generation state: owns the KVCache (keys and values of every layer) and a cache of
/// weights packed into oneDNN's layout (cuda::pack_onednn_weight), each packed on first use.
/// The model's weights must not change while a context is in use; make a new one per
/// generation. Forward passes given a context under c10::InferenceMode run their float32 CPU
/// linears on the packed weights (see set_onednn_linear).
class InferenceContext {
 public:
  /// A KV cache of `capacity` positions for `batch_size` rows (see KVCache).
  InferenceContext(const ModelConfig& config, int64_t batch_size, int64_t capacity, at::TensorOptions options);

  KVCache& kv_cache() { return cache_; }
  const KVCache& kv_cache() const { return cache_; }

  /// `weight` (out, in) in oneDNN's layout, packed the first time this weight is asked for
  /// (keyed by the tensor object, so a weight shared by two layers is packed once).
  const at::Tensor& packed_weight(const at::Tensor& weight);
  /// How many weights have been packed so far.
  std::size_t packed_weight_count() const { return packed_.size(); }

  /// Repeats every cached row n times (a, a, b, b): n samples share one prefill. Packed
  /// weights do not depend on the batch and are kept.
  void repeat_interleave(int64_t n) { cache_.repeat_interleave(n); }

 private:
  KVCache cache_;
  std::unordered_map<const void*, at::Tensor> packed_;
};

}  // namespace hyflow::models
