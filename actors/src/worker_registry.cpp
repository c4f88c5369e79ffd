#include <hyflow/actors/worker_registry.hpp>

#include <hyflow/core/named_registry.hpp>

namespace hyflow::actors {

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
NamedRegistry<Entry>& worker_types() {
  static NamedRegistry<Entry> registry("worker type");
  return registry;
}
}  // namespace

void register_worker_factory(const std::string& name, WorkerFactory factory, std::type_index type,
                             std::shared_ptr<const MethodTableBase> table) {
  const Entry registered = worker_types().add_or_get(name, Entry{std::move(factory), type, table});
  // The same class registered again (from another translation unit) is fine; its entry stays.
  if (registered.type != type || (type == std::type_index(typeid(void)) && registered.table != table))
    throw ValueError("worker type name '" + name + "' is already registered for another class");
}

CreatedWorker create_worker(const WorkerSpec& spec) {
  auto entry = worker_types().get(spec.type);
  CreatedWorker out = entry.factory(spec.args);
  if (!out.worker || !out.table) throw ValueError("factory of worker type '" + spec.type + "' returned nothing");
  return out;
}

bool has_worker_type(const std::string& name) { return worker_types().contains(name); }

std::vector<std::string> worker_type_names() { return worker_types().names(); }

std::type_index worker_type_index(const std::string& name) { return worker_types().get(name).type; }
std::shared_ptr<const MethodTableBase> worker_methods(const std::string& name) {
  return worker_types().get(name).table;
}

}  // namespace hyflow::actors
