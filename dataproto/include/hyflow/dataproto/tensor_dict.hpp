#pragma once
// TensorDict: an ordered map name -> tensor whose tensors share dim 0 (the batch dimension).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hyflow::dataproto {

/// Ordered name -> at::Tensor with a common batch size (dim 0). Any dtype, trailing shape and
/// device. Copying a TensorDict copies tensor handles, never storage.
class TensorDict {
 public:
  using Entry = std::pair<std::string, at::Tensor>;

  TensorDict() = default;
  /// Throws ShapeError when tensors disagree on dim 0 or a tensor is 0-dimensional.
  TensorDict(std::initializer_list<Entry> entries);
  explicit TensorDict(std::vector<Entry> entries);
  /// An empty dict that still carries a batch size (as verl's TensorDict(batch_size=[n])).
  static TensorDict with_batch_size(int64_t batch_size);

  /// Batch size, or nullopt for a dict that never held a tensor nor was given one.
  std::optional<int64_t> batch_size() const { return batch_size_; }
  /// Number of keys.
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  bool contains(std::string_view key) const;
  std::vector<std::string> keys() const;

  /// Throws KeyError naming the key and the keys present.
  const at::Tensor& at(std::string_view key) const;
  at::Tensor& at(std::string_view key);
  const at::Tensor& operator[](std::string_view key) const { return at(key); }

  /// Inserts or replaces; throws ShapeError if dim 0 differs from the batch size.
  void set(std::string key, at::Tensor value);
  /// Removes and returns; throws KeyError when absent.
  at::Tensor pop(std::string_view key);
  void rename(std::string_view old_key, std::string new_key);

  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

  /// Applies f to every tensor, keeping keys and order. The result has batch size
  /// `result_batch_size` (checked against every result), also when the dict has no keys.
  template <class F>
  TensorDict map(F&& f, std::optional<int64_t> result_batch_size) const {
    TensorDict out;
    out.batch_size_ = result_batch_size;
    out.entries_.reserve(entries_.size());
    for (const auto& [k, v] : entries_) out.set(k, f(v));
    return out;
  }

 private:
  const Entry* find(std::string_view key) const;
  std::vector<Entry> entries_;
  std::optional<int64_t> batch_size_;
};

}  // namespace hyflow::dataproto

namespace hyflow {
using dataproto::TensorDict;
}  // namespace hyflow
