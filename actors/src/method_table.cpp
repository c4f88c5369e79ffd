#include <hyflow/actors/method_table.hpp>

namespace hyflow::actors {

const MethodEntry* MethodTableBase::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const MethodEntry& MethodTableBase::at(const std::string& name, const std::string& worker_type) const {
  if (const auto* e = find(name)) return *e;
  std::string names;
  for (const auto& [k, v] : entries_) names += (names.empty() ? "" : ", ") + k;
  throw BindError("worker type '" + worker_type + "' has no method '" + name + "' (methods: " + names + ")", name);
}

void MethodTableBase::insert(MethodEntry entry) {
  if (entries_.count(entry.name)) throw BindError("method '" + entry.name + "' is registered twice");
  auto name = entry.name;
  entries_.emplace(std::move(name), std::move(entry));
}

namespace detail {
void check_arity(const std::string& method, size_t expected, size_t got) {
  if (expected != got)
    throw BindError("method '" + method + "' takes " + std::to_string(expected) + " argument(s), got " +
                        std::to_string(got),
                    method);
}
}  // namespace detail

}  // namespace hyflow::actors
