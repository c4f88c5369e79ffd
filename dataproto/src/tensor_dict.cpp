#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/tensor_dict.hpp>

#include <sstream>

namespace hyflow::dataproto {
namespace {

std::string join_keys(const std::vector<std::string>& keys) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", " : "") << keys[i];
  os << ']';
  return os.str();
}

}  // namespace

TensorDict::TensorDict(std::initializer_list<Entry> entries)
    : TensorDict(std::vector<Entry>(entries)) {}

TensorDict::TensorDict(std::vector<Entry> entries) {
  entries_.reserve(entries.size());
  for (auto& [k, v] : entries) set(std::move(k), std::move(v));
}

TensorDict TensorDict::with_batch_size(int64_t batch_size) {
  if (batch_size < 0)
    throw ShapeError("TensorDict: negative batch size " + std::to_string(batch_size));
  TensorDict td;
  td.batch_size_ = batch_size;
  return td;
}

const TensorDict::Entry* TensorDict::find(std::string_view key) const {
  for (const auto& e : entries_)
    if (e.first == key) return &e;
  return nullptr;
}

bool TensorDict::contains(std::string_view key) const { return find(key) != nullptr; }

std::vector<std::string> TensorDict::keys() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.first);
  return out;
}

const at::Tensor& TensorDict::at(std::string_view key) const {
  if (const Entry* e = find(key)) return e->second;
  throw KeyError("TensorDict: no tensor '" + std::string(key) + "' (keys: " + join_keys(keys()) + ")");
}

at::Tensor& TensorDict::at(std::string_view key) {
  return const_cast<at::Tensor&>(static_cast<const TensorDict&>(*this).at(key));
}

void TensorDict::set(std::string key, at::Tensor value) {
  if (!value.defined()) throw ValueError("TensorDict: tensor '" + key + "' is undefined");
  if (value.dim() == 0)
    throw ShapeError("TensorDict: tensor '" + key + "' is 0-dimensional; a batch needs dim 0");
  const int64_t rows = value.size(0);
  // Replacing the only tensor may change the batch size; otherwise it must match.
  const bool sole_entry = entries_.size() == 1 && entries_[0].first == key;
  if (batch_size_ && *batch_size_ != rows && !sole_entry)
    throw ShapeError("TensorDict: tensor '" + key + "' has " + std::to_string(rows) +
                     " rows but the batch size is " + std::to_string(*batch_size_));
  batch_size_ = rows;
  for (auto& e : entries_)
    if (e.first == key) {
      e.second = std::move(value);
      return;
    }
  entries_.emplace_back(std::move(key), std::move(value));
}

at::Tensor TensorDict::pop(std::string_view key) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->first == key) {
      at::Tensor t = std::move(it->second);
      entries_.erase(it);
      return t;
    }
  throw KeyError("TensorDict: cannot pop '" + std::string(key) + "' (keys: " + join_keys(keys()) + ")");
}

void TensorDict::rename(std::string_view old_key, std::string new_key) {
  if (old_key == new_key) {
    at(old_key);  // still report a missing key
    return;
  }
  if (contains(new_key))
    throw KeyError("TensorDict: cannot rename '" + std::string(old_key) + "' to '" + new_key +
                   "': the key exists");
  for (auto& e : entries_)
    if (e.first == old_key) {
      e.first = std::move(new_key);
      return;
    }
  throw KeyError("TensorDict: cannot rename '" + std::string(old_key) + "' (keys: " + join_keys(keys()) + ")");
}

}  // namespace hyflow::dataproto
