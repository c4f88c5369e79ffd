#pragma once
// OrderedDict<V>: string -> V in insertion order, like a Python dict. Backed by a vector:
// batches carry a handful of keys, so linear lookup beats hashing.

#include <hyflow/core/error.hpp>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hyflow::dataproto {

template <class V>
class OrderedDict {
 public:
  using value_type = std::pair<std::string, V>;
  using iterator = typename std::vector<value_type>::iterator;
  using const_iterator = typename std::vector<value_type>::const_iterator;

  OrderedDict() = default;
  OrderedDict(std::initializer_list<value_type> items) {
    for (const auto& [k, v] : items) (*this)[k] = v;
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  iterator begin() { return items_.begin(); }
  iterator end() { return items_.end(); }
  const_iterator begin() const { return items_.begin(); }
  const_iterator end() const { return items_.end(); }

  iterator find(std::string_view key) {
    return std::find_if(items_.begin(), items_.end(), [&](const value_type& e) { return e.first == key; });
  }
  const_iterator find(std::string_view key) const {
    return std::find_if(items_.begin(), items_.end(), [&](const value_type& e) { return e.first == key; });
  }
  bool contains(std::string_view key) const { return find(key) != end(); }

  /// Inserts a default value when the key is new (appended at the end).
  V& operator[](std::string_view key) {
    auto it = find(key);
    if (it != end()) return it->second;
    items_.emplace_back(std::string(key), V{});
    return items_.back().second;
  }
  /// KeyError naming the key when absent.
  const V& at(std::string_view key) const {
    auto it = find(key);
    if (it == end()) throw KeyError("no key '" + std::string(key) + "'");
    return it->second;
  }
  V& at(std::string_view key) { return const_cast<V&>(static_cast<const OrderedDict&>(*this).at(key)); }

  iterator erase(const_iterator it) { return items_.erase(it); }
  bool erase(std::string_view key) {
    auto it = find(key);
    if (it == end()) return false;
    items_.erase(it);
    return true;
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    out.reserve(items_.size());
    for (const auto& e : items_) out.push_back(e.first);
    return out;
  }

  bool operator==(const OrderedDict&) const = default;

 private:
  std::vector<value_type> items_;
};

}  // namespace hyflow::dataproto
