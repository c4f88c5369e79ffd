// Placement: runtime, resource pools (in-process or on caf-nodes) and the role groups.
#include <hyflow/trainer/placement.hpp>

#include <hyflow/cluster/all.hpp>
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/workers/register.hpp>

#include <torch/cuda.h>

#include <cmath>

namespace hyflow::trainer {

namespace {

/// ValueError from `read` prefixed with the config key it came from.
template <class Read>
auto with_key(const char* key, Read&& read) {
  try {
    return read();
  } catch (const ValueError& e) {
    throw ValueError(std::string("config key '") + key + "': " + e.what());
  }
}

/// The runtime of workers on caf-node processes, with its launcher set; `advertised` gets the
/// GPUs per node in the launcher's node order.
std::unique_ptr<Runtime> connect_cluster(const ClusterSection& c, std::shared_ptr<cluster::RemoteLauncher>& nodes) {
  const cluster::TlsFiles tls{c.tls_cert.value_or(""), c.tls_key.value_or(""), c.tls_ca.value_or("")};
  // errors name the key (check_tls_files names the cluster.tls_* keys itself)
  const RuntimeOptions ro = cluster::with_tls({.network = true,
                                               .heartbeat_interval_ms = static_cast<int>(c.heartbeat_ms),
                                               .connection_timeout_ms = static_cast<int>(c.connection_timeout_ms)},
                                              tls, {"cluster.tls_cert", "cluster.tls_key", "cluster.tls_ca"});
  cluster::ClusterOptions options;
  options.nodes = with_key("cluster.nodes", [&] { return cluster::parse_node_list(*c.nodes); });
  if (c.secret_file)
    options.secret = with_key("cluster.secret_file", [&] { return cluster::read_secret_file(*c.secret_file); });
  options.tls = tls;
  if (c.data_plane_bind || c.data_plane_host) {
    // the nodes pull large arguments from this process: its data server must be reachable
    auto plane = cluster::DataPlane::process_options();
    if (c.data_plane_bind) plane.bind = *c.data_plane_bind;
    if (c.data_plane_host) plane.advertise = *c.data_plane_host;
    cluster::DataPlane::configure(plane);
  }
  auto runtime = std::make_unique<Runtime>(ro);
  nodes = cluster::RemoteLauncher::connect(*runtime, std::move(options));
  runtime->set_launcher(nodes);
  return runtime;
}

}  // namespace

Placement::Placement(const std::vector<RoleSpec>& roles, const std::vector<PoolSpec>& pools,
                     const TrainerSection& trainer, const ClusterSection& cluster) {
  std::map<std::string, const PoolSpec*> pool_of;
  for (const auto& p : pools) pool_of[p.name] = &p;
  for (const auto& role : roles) {
    if (!role.enabled) continue;
    if (!pool_of.count(role.pool))
      throw ValueError("role '" + role.name + "' is placed on resource pool '" + role.pool + "', which is not defined");
    check_role_config(role);
  }
  workers::register_workers();
  WorkerGroupOptions group_options;  // trainer.call_timeout_s: a call no rank answers in time fails
  if (trainer.call_timeout_s > 0)
    group_options.call_deadline =
        std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::ceil(trainer.call_timeout_s * 1000))));

  // trainer.device (cpu | cuda | auto): GPUs give each worker cuda:<local rank>
  std::function<ResourcePool(const std::vector<int>&)> make_pool;
  std::shared_ptr<cluster::RemoteLauncher> nodes;
  if (!cluster.nodes) {
    runtime_ = std::make_unique<Runtime>();
    const int visible = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    make_pool = [&trainer, visible](const std::vector<int>& per_node) {  // every node shares this process's devices
      const bool gpu = ResourcePool::wants_gpus(trainer.device, per_node, std::vector<int>(per_node.size(), visible));
      return ResourcePool(per_node, 10, gpu ? visible : 8, gpu);
    };
  } else {
    // workers on caf-node processes: the pool's nodes (sorted by address) with its workers each
    runtime_ = connect_cluster(cluster, nodes);
    std::vector<int> advertised;  // GPUs per node, in the launcher's node order
    for (const auto& info : nodes->nodes()) advertised.push_back(info.gpus);
    make_pool = [&trainer, nodes, advertised](const std::vector<int>& per_node) {
      return nodes->pool(per_node, ResourcePool::wants_gpus(trainer.device, per_node, advertised));
    };
  }

  for (const auto& pool : pools) {
    std::vector<const RoleSpec*> placed;
    for (const auto& role : roles)
      if (role.enabled && role.pool == pool.name) placed.push_back(&role);
    if (placed.empty()) continue;
    WorkerGroupOptions options = group_options;
    options.name_prefix = pool.name_prefix;
    if (pool.name == "global") {
      // verl's default placement: every role of the pool in one worker, one view per role
      std::vector<std::pair<std::string, WorkerSpec>> specs;
      std::vector<std::string> names;
      for (const RoleSpec* r : placed) {
        specs.emplace_back(r->name, WorkerSpec{r->worker_type, r->init_args});
        names.push_back(r->name);
      }
      bundle_.emplace(*runtime_, make_pool(pool.workers_per_node), colocated_spec(specs), options);
      for (auto& [name, view] : bundle_->spawn(names)) groups_.emplace(name, std::move(view));
      continue;
    }
    for (const RoleSpec* r : placed)
      groups_.emplace(r->name, WorkerGroup(*runtime_, make_pool(pool.workers_per_node),
                                           WorkerSpec{r->worker_type, r->init_args}, options));
  }
}

Placement::~Placement() = default;

WorkerGroup& Placement::group(const std::string& role) {
  auto it = groups_.find(role);
  if (it == groups_.end()) throw KeyError("role '" + role + "' is not placed (disabled or not in the role table)");
  return it->second;
}

WorkerGroup* Placement::find(const std::string& role) {
  auto it = groups_.find(role);
  return it == groups_.end() ? nullptr : &it->second;
}

}  // namespace hyflow::trainer
