#include <hyflow/actors/worker_registry.hpp>

#include <map>
#include <mutex>

namespace hyflow {

WorkerSpec WorkerSpec::from_json(const Json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw FormatError("WorkerSpec: expected {\"type\": name, \"args\": {...}}, got " + j.dump());
  return WorkerSpec{j["type"].get<std::string>(), j.value("args", Json::object())};
}

namespace {
struct Entry {
  WorkerFactory factory;
  std::type_index type = typeid(void);
  std::shared_ptr<const MethodTableBase> table;
};
struct Registry {
  std::mutex mutex;
  std::map<std::string, Entry> types;
};
Registry& registry() {
  static Registry r;
  return r;
}
std::string known(const Registry& r) {
  std::string out;
  for (const auto& [k, v] : r.types) out += (out.empty() ? "" : ", ") + k;
  return out.empty() ? "none" : out;
}
Entry lookup(const std::string& name) {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  auto it = reg.types.find(name);
  if (it == reg.types.end()) throw KeyError("unknown worker type '" + name + "' (registered: " + known(reg) + ")");
  return it->second;
}
}  // namespace

void register_worker_factory(const std::string& name, WorkerFactory factory, std::type_index type,
                             std::shared_ptr<const MethodTableBase> table) {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  auto it = reg.types.find(name);
  if (it != reg.types.end()) {
    if (it->second.type == type && type != std::type_index(typeid(void))) return;  // same class again
    throw ValueError("worker type name '" + name + "' is already registered for another class");
  }
  reg.types[name] = Entry{std::move(factory), type, std::move(table)};
}

CreatedWorker create_worker(const WorkerSpec& spec) {
  auto entry = lookup(spec.type);
  CreatedWorker out = entry.factory(spec.args);
  if (!out.worker || !out.table) throw ValueError("factory of worker type '" + spec.type + "' returned nothing");
  return out;
}

bool has_worker_type(const std::string& name) {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  return reg.types.count(name) > 0;
}

std::type_index worker_type_index(const std::string& name) { return lookup(name).type; }
std::shared_ptr<const MethodTableBase> worker_methods(const std::string& name) { return lookup(name).table; }

}  // namespace hyflow
