#include <hyflow/actors/worker.hpp>
#include <hyflow/actors/worker_registry.hpp>
#include <hyflow/core/named_registry.hpp>

namespace hyflow::actors {

Json WorkerEnv::to_json() const {
  return Json{{"RANK", rank},
              {"WORLD_SIZE", world_size},
              {"LOCAL_RANK", local_rank},
              {"LOCAL_WORLD_SIZE", local_world_size},
              {"MASTER_ADDR", master_addr},
              {"MASTER_PORT", master_port},
              {"DEVICE", device},
              {"NAME", name},
              {"STORE_TOKEN", store_token},
              {"NODE", node}};
}

WorkerEnv WorkerEnv::from_json(const Json& j) {
  WorkerEnv e;
  try {
    e.rank = j.at("RANK").get<int>();
    e.world_size = j.at("WORLD_SIZE").get<int>();
    e.local_rank = j.at("LOCAL_RANK").get<int>();
    e.local_world_size = j.at("LOCAL_WORLD_SIZE").get<int>();
    e.master_addr = j.at("MASTER_ADDR").get<std::string>();
    e.master_port = j.at("MASTER_PORT").get<int>();
    e.device = j.at("DEVICE").get<std::string>();
    e.name = j.at("NAME").get<std::string>();
    e.store_token = j.value("STORE_TOKEN", std::string());
    e.node = j.value("NODE", std::string());
  } catch (const Json::exception& ex) {
    throw FormatError(std::string("WorkerEnv: ") + ex.what() + " in " + j.dump());
  }
  return e;
}

namespace detail {
namespace {
thread_local const WorkerEnv* current_env = nullptr;
thread_local std::shared_ptr<WorkerHost> current_host;
}  // namespace
WorkerEnvScope::WorkerEnvScope(const WorkerEnv& env, std::shared_ptr<WorkerHost> host)
    : previous_env_(current_env), previous_host_(std::move(current_host)) {
  current_env = &env;
  current_host = std::move(host);
}
WorkerEnvScope::~WorkerEnvScope() {
  current_env = previous_env_;
  current_host = std::move(previous_host_);
}
}  // namespace detail

Worker::Worker()
    : env_(detail::current_env ? *detail::current_env : WorkerEnv{}),
      host_(detail::current_host ? detail::current_host : std::make_shared<WorkerHost>()) {}
Worker::Worker(WorkerEnv env, std::shared_ptr<WorkerHost> host)
    : env_(std::move(env)), host_(host ? std::move(host) : std::make_shared<WorkerHost>()) {}
Worker::~Worker() = default;

void Worker::register_dispatch_collect_info(const std::string& mesh, int64_t dp_rank, bool is_collect) {
  if (meshes_.count(mesh))
    throw ValueError("mesh '" + mesh + "' is already registered on rank " + std::to_string(rank()));
  meshes_[mesh] = {dp_rank, is_collect};
}

int64_t Worker::query_dispatch_info(const std::string& mesh) const {
  auto it = meshes_.find(mesh);
  if (it == meshes_.end())
    throw KeyError("mesh '" + mesh + "' is not registered on rank " + std::to_string(rank()) +
                   " (call register_dispatch_collect_info first)");
  return it->second.dp_rank;
}

bool Worker::query_collect_info(const std::string& mesh) const {
  auto it = meshes_.find(mesh);
  if (it == meshes_.end())
    throw KeyError("mesh '" + mesh + "' is not registered on rank " + std::to_string(rank()) +
                   " (call register_dispatch_collect_info first)");
  return it->second.is_collect;
}

void Worker::exit_worker(const std::string& reason) { throw detail::WorkerExit{reason}; }

namespace {
NamedRegistry<WorkerFunction>& worker_functions() {
  static NamedRegistry<WorkerFunction> registry("worker function");
  return registry;
}
}  // namespace

void register_worker_function(const std::string& name, WorkerFunction fn) {
  worker_functions().add(name, std::move(fn));
}

DataProto Worker::execute_with_func_generator(const std::string& function, DataProto data) {
  return worker_functions().get(function)(*this, std::move(data));
}

}  // namespace hyflow::actors
