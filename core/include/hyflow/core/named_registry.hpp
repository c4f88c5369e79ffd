#pragma once
// NamedRegistry<T>: a thread-safe name -> value table, the one shape behind hyflow's open
// registries (dispatch and execute modes, worker types, worker functions, trainer algorithms,
// reward functions). Lookups of unknown names throw a KeyError that lists what is registered
// and suggests the closest name.

#include <hyflow/core/error.hpp>
#include <hyflow/core/suggest.hpp>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hyflow {

template <class T>
class NamedRegistry {
 public:
  /// `what` names an entry in messages ("dispatch mode", "worker type").
  explicit NamedRegistry(std::string what) : what_(std::move(what)) {}
  NamedRegistry(std::string what, std::map<std::string, T> entries)
      : what_(std::move(what)), entries_(std::move(entries)) {}
  NamedRegistry(const NamedRegistry&) = delete;
  NamedRegistry& operator=(const NamedRegistry&) = delete;

  /// Adds a new name; ValueError when it is taken.
  void add(const std::string& name, T value) {
    std::lock_guard lock(mutex_);
    if (!entries_.emplace(name, std::move(value)).second)
      throw ValueError(what_ + " '" + name + "' is already registered");
  }
  /// Adds or replaces.
  void set(const std::string& name, T value) {
    std::lock_guard lock(mutex_);
    entries_.insert_or_assign(name, std::move(value));
  }
  /// What the public register_* functions do: `overwrite` adds or replaces, otherwise adds
  /// (ValueError when the name is taken). An empty value (a null std::function or pointer) is a
  /// ValueError naming the entry.
  void put(const std::string& name, T value, bool overwrite) {
    if constexpr (requires { value == nullptr; }) {
      if (value == nullptr) throw ValueError("cannot register an empty " + what_ + " as '" + name + "'");
    }
    if (overwrite)
      set(name, std::move(value));
    else
      add(name, std::move(value));
  }
  /// Adds `value` unless the name is taken; returns the entry now registered under it.
  T add_or_get(const std::string& name, T value) {
    std::lock_guard lock(mutex_);
    return entries_.emplace(name, std::move(value)).first->second;
  }
  /// Replaces an existing name; KeyError (listing the names) when it is unknown.
  void replace(const std::string& name, T value) {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end()) throw unknown_locked(name);
    it->second = std::move(value);
  }
  /// The value of a name (a copy: registries hold handles); KeyError when it is unknown.
  T get(const std::string& name) const {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end()) throw unknown_locked(name);
    return it->second;
  }
  std::optional<T> find(const std::string& name) const {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
  }
  bool contains(const std::string& name) const {
    std::lock_guard lock(mutex_);
    return entries_.count(name) > 0;
  }
  /// Registered names in sorted order.
  std::vector<std::string> names() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& [name, value] : entries_) out.push_back(name);
    return out;
  }
  /// The KeyError a lookup of `name` throws: "unknown <what> 'x' (registered: a, b); did you
  /// mean 'y'?".
  KeyError unknown(const std::string& name) const {
    std::lock_guard lock(mutex_);
    return unknown_locked(name);
  }

 private:
  KeyError unknown_locked(const std::string& name) const {
    std::vector<std::string> known;
    for (const auto& [k, v] : entries_) known.push_back(k);
    return KeyError("unknown " + what_ + " '" + name + "' (registered: " + join_names(known) + ")" +
                    did_you_mean(name, known));
  }

  std::string what_;
  mutable std::mutex mutex_;
  std::map<std::string, T> entries_;
};

}  // namespace hyflow
