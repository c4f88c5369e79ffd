#pragma once
// Key/value cache for incremental decoding, preallocated to its capacity so that each step
// writes in place instead of concatenating. It holds keys and values only; the rest of the
// per-generation state lives in InferenceContext (inference_context.hpp).

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace hyflow::models {

struct ModelConfig;

class KVCache {
 public:
  /// One (B, H_kv, capacity, D) key and value tensor per layer.
  KVCache(const ModelConfig& config, int64_t batch_size, int64_t capacity, at::TensorOptions options);

  int64_t batch_size() const { return batch_size_; }
  int64_t capacity() const { return capacity_; }
  /// Positions written so far (the next token lands at index length()).
  int64_t length() const { return length_; }

  /// Writes this step's k, v (B, H_kv, T, D) of `layer` at [length, length + T) and returns
  /// views of everything cached for that layer: (B, H_kv, length + T, D).
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  /// Commits T positions once every layer has appended them.
  void advance(int64_t steps);
  /// Repeats every row n times (a, a, b, b): n samples share one prefill.
  void repeat_interleave(int64_t n);

 private:
  std::vector<at::Tensor> keys_, values_;
  int64_t batch_size_, capacity_, length_ = 0;
};

}  // namespace hyflow::models
