#pragma once
// ConfigSection: reads one JSON object of a verl config subtree into a typed section struct:
// values by key, nested sections, keys verl has that hyflow ignores, and an error for every
// other key. Every message names the full key path. The one config reader of hyflow: the role
// workers (workers/src/config.cpp) and the trainer (trainer/src/sections.cpp) read with it.
//
// The read calls are also the declaration of the section: a ConfigSection made with a key list
// (describe mode) records every key it reads, with its type, its default (the value the
// struct member holds before reading) and its help line, into hyflow::ConfigKey entries; the
// trainer builds its key table and --help from them, so a key is declared where it is read.

#include <hyflow/core/config_key.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/core/suggest.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace hyflow {

/// How a key is documented in the key table.
struct KeyDoc {
  const char* help = "";
  /// The table's default is null (the trainer or another key fills it; `help` says how) instead
  /// of the struct's value.
  bool null_default = false;
  /// Smallest value (integer and number keys); null: none.
  nlohmann::json minimum = nullptr;
  /// Set by the trainer itself (the schedule length, seeds): read, but not a key of the table.
  bool set_by_trainer = false;
};

class ConfigSection {
 public:
  /// `keys`: describe mode, recording every key read (see the file comment); validation that
  /// depends on values is skipped by the readers (describing()).
  ConfigSection(const nlohmann::json& json, std::string path, std::vector<ConfigKey>* keys = nullptr)
      : path_(std::move(path)), keys_(keys) {
    if (json.is_null()) return;
    if (!json.is_object()) throw ValueError("config section '" + path_ + "' must be an object, got " + json.dump());
    json_ = json;
  }

  std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  /// Reads `key` into `out` when present and not null; leaves the default otherwise. A value
  /// below `doc.minimum` is a ValueError naming the key.
  template <class T>
  void read(const std::string& key, T& out, const KeyDoc& doc = {}) {
    seen_.insert(key);
    if (keys_ && !doc.set_by_trainer)
      record<T>(key, doc.null_default ? nlohmann::json() : nlohmann::json(out), doc, doc.null_default);
    if (!json_.contains(key) || json_.at(key).is_null()) return;
    out = convert<T>(json_.at(key), key);
    check_minimum(key, nlohmann::json(out), doc);
  }
  template <class T>
  void read(const std::string& key, std::optional<T>& out, const KeyDoc& doc = {}) {
    seen_.insert(key);
    if (keys_ && !doc.set_by_trainer)
      record<T>(key, out && !doc.null_default ? nlohmann::json(*out) : nlohmann::json(), doc, true);
    if (!json_.contains(key) || json_.at(key).is_null()) return;
    out = convert<T>(json_.at(key), key);
    check_minimum(key, nlohmann::json(*out), doc);
  }
  /// A key of verl's config that hyflow accepts, type-checks and does not use: declared in the
  /// key table (so INI files and the command line take it) with `default_value`.
  template <class T>
  void accept(const std::string& key, T default_value, const char* help) {
    read(key, default_value, {.help = help});
  }
  /// Whether this section only records its keys (readers skip value checks then).
  bool describing() const { return keys_ != nullptr; }
  bool has(const std::string& key) const { return json_.contains(key) && !json_.at(key).is_null(); }

  /// A nested object (empty when absent or null).
  ConfigSection sub(const std::string& key) {
    seen_.insert(key);
    return ConfigSection(json_.contains(key) ? json_.at(key) : nlohmann::json(), key_path(key), keys_);
  }

  /// Keys of verl's config that hyflow accepts and does not use.
  void ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys) seen_.insert(k);
  }

  /// KeyError naming the first key that was neither read nor ignored, with the closest known
  /// key of this section as a suggestion.
  void finish() const {
    for (auto it = json_.begin(); it != json_.end(); ++it)
      if (!seen_.count(it.key())) {
        const std::vector<std::string> known(seen_.begin(), seen_.end());
        const std::string near = closest_name(it.key(), known);
        throw KeyError("unknown config key '" + key_path(it.key()) + "'" +
                       (near.empty() ? "" : "; did you mean '" + key_path(near) + "'?"));
      }
  }

 private:
  template <class T>
  static KeyType type_of() {
    if constexpr (std::is_same_v<T, bool>)
      return KeyType::boolean;
    else if constexpr (std::is_integral_v<T>)
      return KeyType::integer;
    else if constexpr (std::is_floating_point_v<T>)
      return KeyType::number;
    else if constexpr (std::is_same_v<T, std::string>)
      return KeyType::string;
    else
      return KeyType::list;
  }
  template <class T>
  void record(const std::string& key, nlohmann::json def, const KeyDoc& doc, bool nullable) {
    keys_->push_back(ConfigKey{key_path(key), type_of<T>(), std::move(def), doc.help, nullable, doc.minimum});
  }
  void check_minimum(const std::string& key, const nlohmann::json& v, const KeyDoc& doc) const {
    if (!doc.minimum.is_null() && v.is_number() && v.get<double>() < doc.minimum.get<double>())
      throw ValueError("config key '" + key_path(key) + "' must be >= " + doc.minimum.dump() + ", got " + v.dump());
  }

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
      if (!v.is_number() || !std::isfinite(v.get<double>())) fail(key, v, "a finite number");
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
  std::vector<ConfigKey>* keys_ = nullptr;
  std::set<std::string> seen_;
};

/// ValueError "config key '<path>' must be <what>, got <value>" unless `ok`.
template <class V>
void require_config(bool ok, const std::string& path, const std::string& what, const V& value) {
  if (!ok) throw ValueError("config key '" + path + "' must be " + what + ", got " + nlohmann::json(value).dump());
}

}  // namespace hyflow
