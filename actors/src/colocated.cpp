#include <hyflow/actors/colocated.hpp>

namespace hyflow::actors {

WorkerSpec colocated_spec(const std::vector<std::pair<std::string, WorkerSpec>>& roles) {
  if (roles.empty()) throw ValueError("colocated_spec: no roles");
  Json list = Json::array();
  std::map<std::string, bool> seen;
  for (const auto& [role, spec] : roles) {
    if (role.empty()) throw ValueError("colocated_spec: empty role name");
    if (seen[role]) throw ValueError("colocated_spec: role '" + role + "' appears twice");
    seen[role] = true;
    list.push_back(Json{{"role", role}, {"spec", spec.to_json()}});
  }
  return WorkerSpec{kColocatedWorkerType, Json{{"roles", list}}};
}

std::vector<std::pair<std::string, WorkerSpec>> colocated_roles(const WorkerSpec& spec) {
  if (spec.type != kColocatedWorkerType || !spec.args.contains("roles"))
    throw KeyError("worker type '" + spec.type + "' is not a colocated bundle");
  std::vector<std::pair<std::string, WorkerSpec>> out;
  for (const auto& r : spec.args.at("roles"))
    out.emplace_back(r.at("role").get<std::string>(), WorkerSpec::from_json(r.at("spec")));
  return out;
}

std::shared_ptr<const MethodTableBase> colocated_table(const WorkerSpec& spec) {
  auto table = std::make_shared<MethodTable<ColocatedWorker>>();
  add_builtin_methods<ColocatedWorker>(*table);
  std::map<std::string, std::shared_ptr<const MethodTableBase>> role_tables;
  for (const auto& [role, role_spec] : colocated_roles(spec)) {
    auto role_table = worker_methods(role_spec.type);
    if (!role_table) throw ValueError("colocated role '" + role + "': type '" + role_spec.type + "' cannot be nested");
    role_tables[role] = role_table;
    for (const auto& [name, entry] : role_table->entries()) {
      auto wrap = [&, role = role](std::string exposed) {
        MethodEntry e = entry;
        e.name = std::move(exposed);
        e.invoke = [role, inner = entry.invoke](Worker& w, std::vector<Value>& a) {
          return inner(static_cast<ColocatedWorker&>(w).role(role), a);
        };
        table->insert(std::move(e));
      };
      wrap(role + "_" + name);
      if (entry.options.dispatch == Dispatch::DIRECT_ROLLOUT_METHOD && !table->find(name)) wrap(name);
    }
  }
  MethodEntry fused;
  fused.name = kFusedExecuteMethod;
  fused.arity = 3;
  fused.parameter_types = {"string", "string", "list"};
  fused.result_type = "Value";
  fused.invoke = [role_tables](Worker& w, std::vector<Value>& a) -> Value {
    detail::check_arity(kFusedExecuteMethod, 3, a.size());
    const auto role = from_value<std::string>(a[0], "role of fused_execute");
    const auto method = from_value<std::string>(a[1], "method of fused_execute");
    auto it = role_tables.find(role);
    if (it == role_tables.end()) throw KeyError("fused_execute: no role '" + role + "' in this bundle");
    return it->second->at(method, role).invoke(static_cast<ColocatedWorker&>(w).role(role), a[2].list());
  };
  table->insert(std::move(fused));
  return table;
}

ColocatedWorker::ColocatedWorker(const Json& args) {
  const WorkerSpec spec{kColocatedWorkerType, args};
  for (auto& [role, role_spec] : colocated_roles(spec)) {
    CreatedWorker created = create_worker(role_spec);  // same thread, same environment
    order_.push_back(role);
    roles_[role] = std::move(created.worker);
  }
}

Worker& ColocatedWorker::role(const std::string& name) {
  auto it = roles_.find(name);
  if (it == roles_.end()) throw KeyError("colocated worker has no role '" + name + "'");
  return *it->second;
}

void register_colocated_worker_type() {
  register_worker_factory(
      kColocatedWorkerType,
      [](const Json& args) {
        CreatedWorker out;
        out.worker = std::make_unique<ColocatedWorker>(args);
        out.table = colocated_table(WorkerSpec{kColocatedWorkerType, args});
        return out;
      },
      typeid(ColocatedWorker), nullptr);
}

}  // namespace hyflow::actors
