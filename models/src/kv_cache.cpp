#include <hyflow/models/kv_cache.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/models/config.hpp>

namespace hyflow::models {

KVCache::KVCache(const ModelConfig& config, int64_t batch_size, int64_t capacity, at::TensorOptions options)
    : batch_size_(batch_size), capacity_(capacity) {
  if (batch_size <= 0 || capacity <= 0) {
    throw ValueError("KVCache: batch_size and capacity must be > 0, got " + std::to_string(batch_size) + " and " +
                     std::to_string(capacity));
  }
  const auto shape = std::vector<int64_t>{batch_size, config.num_key_value_heads, capacity, config.resolved_head_dim()};
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    keys_.push_back(at::empty(shape, options));
    values_.push_back(at::empty(shape, options));
  }
}

std::pair<at::Tensor, at::Tensor> KVCache::append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  const int64_t steps = k.size(2);
  if (length_ + steps > capacity_) {
    throw ShapeError("KVCache: " + std::to_string(length_) + " cached + " + std::to_string(steps) +
                     " new positions exceed the capacity " + std::to_string(capacity_));
  }
  if (k.size(0) != batch_size_) {
    throw ShapeError("KVCache: batch of " + std::to_string(k.size(0)) + " rows, cache holds " +
                     std::to_string(batch_size_));
  }
  auto& keys = keys_.at(layer);
  auto& values = values_.at(layer);
  keys.narrow(2, length_, steps).copy_(k);
  values.narrow(2, length_, steps).copy_(v);
  return {keys.narrow(2, 0, length_ + steps), values.narrow(2, 0, length_ + steps)};
}

void KVCache::advance(int64_t steps) {
  length_ += steps;
}

void KVCache::repeat_interleave(int64_t n) {
  if (n == 1) return;
  for (auto* list : {&keys_, &values_}) {
    for (auto& t : *list) t = t.repeat_interleave(n, 0);
  }
  batch_size_ *= n;
}

}  // namespace hyflow::models
