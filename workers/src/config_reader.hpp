#pragma once
// Reads one JSON object of a verl config subtree: typed values by key, nested sections, keys
// verl has that hyflow ignores, and an error for every other key. Every message names the
// full key path.

#include <hyflow/core/error.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <type_traits>

namespace hyflow::workers::detail {

class Section {
 public:
  Section(const nlohmann::json& json, std::string path) : path_(std::move(path)) {
    if (json.is_null()) return;
    if (!json.is_object()) throw ValueError("config section '" + path_ + "' must be an object, got " + json.dump());
    json_ = json;
  }

  std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  /// Reads `key` into `out` when present and not null; leaves the default otherwise.
  template <class T>
  void read(const std::string& key, T& out) {
    seen_.insert(key);
    if (!json_.contains(key) || json_.at(key).is_null()) return;
    out = convert<T>(json_.at(key), key);
  }
  template <class T>
  void read(const std::string& key, std::optional<T>& out) {
    seen_.insert(key);
    if (!json_.contains(key) || json_.at(key).is_null()) return;
    out = convert<T>(json_.at(key), key);
  }
  bool has(const std::string& key) const { return json_.contains(key) && !json_.at(key).is_null(); }

  /// A nested object (empty when absent or null).
  Section sub(const std::string& key) {
    seen_.insert(key);
    return Section(json_.contains(key) ? json_.at(key) : nlohmann::json(), key_path(key));
  }

  /// Keys of verl's config that hyflow accepts and does not use.
  void ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys) seen_.insert(k);
  }

  /// KeyError naming the first key that was neither read nor ignored.
  void finish() const {
    for (auto it = json_.begin(); it != json_.end(); ++it)
      if (!seen_.count(it.key()))
        throw KeyError("unknown config key '" + key_path(it.key()) + "'");
  }

 private:
  template <class T>
  T convert(const nlohmann::json& v, const std::string& key) const {
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) fail(key, v, "a boolean");
      return v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) fail(key, v, "an integer");
      if constexpr (std::is_unsigned_v<T>) {
        if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)
          fail(key, v, "a non-negative integer");
      }
      return v.get<T>();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) fail(key, v, "a number");
      return v.get<T>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) fail(key, v, "a string");
      return v.get<std::string>();
    } else {
      try {
        return v.get<T>();
      } catch (const nlohmann::json::exception&) {
        fail(key, v, "a value of the expected type");
      }
    }
  }
  [[noreturn]] void fail(const std::string& key, const nlohmann::json& v, const char* wanted) const {
    throw ValueError("config key '" + key_path(key) + "' must be " + wanted + ", got " + v.dump());
  }

  nlohmann::json json_ = nlohmann::json::object();
  std::string path_;
  std::set<std::string> seen_;
};

/// ValueError "config key '<path>' must be <what>, got <value>" unless `ok`.
template <class V>
void require(bool ok, const std::string& path, const std::string& what, const V& value) {
  if (!ok) throw ValueError("config key '" + path + "' must be " + what + ", got " + nlohmann::json(value).dump());
}

}  // namespace hyflow::workers::detail
