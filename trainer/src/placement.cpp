// Placement: runtime, resource pools (in-process or on caf-nodes) and the role groups.
#include <hyflow/trainer/placement.hpp>

#include <hyflow/cluster/all.hpp>
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/workers/register.hpp>

#include <torch/cuda.h>

#include <algorithm>
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
                     const TrainerSection& trainer, const ClusterSection& cluster,
                     std::optional<int> gpus_in_process) {
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
  else
    group_options.call_deadline.reset();

  // The pools that hold an enabled role; every pool is made once, so the roles on it share its devices.
  std::vector<const PoolSpec*> used;
  for (const auto& pool : pools)
    if (std::any_of(roles.begin(), roles.end(), [&](const RoleSpec& r) { return r.enabled && r.pool == pool.name; }))
      used.push_back(&pool);

  // trainer.device (cpu | cuda | auto). The pools share the GPUs of a host (in-process: this
  // process's devices, whatever the pool's node count; on a cluster: each caf-node's), so a
  // GpuAllocator hands each pool devices no other pool holds.
  std::shared_ptr<cluster::RemoteLauncher> nodes;
  std::vector<GpuAllocator::Host> hosts;
  if (!cluster.nodes) {
    runtime_ = std::make_unique<Runtime>();
    const int visible = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    hosts.push_back({.name = "this process", .gpus = gpus_in_process.value_or(visible)});
  } else {
    runtime_ = connect_cluster(cluster, nodes);
    for (const auto& info : nodes->nodes()) hosts.push_back({.name = "caf-node " + info.address, .gpus = info.gpus});
  }
  const bool in_process = !cluster.nodes;
  std::vector<int> demand(hosts.size(), 0);  // workers per host, all pools together
  for (const PoolSpec* pool : used)
    for (size_t node = 0; node < pool->workers_per_node.size(); ++node)
      if (in_process || node < demand.size()) demand[in_process ? 0 : node] += pool->workers_per_node[node];
  std::vector<int> gpus_per_host;
  for (const auto& h : hosts) gpus_per_host.push_back(h.gpus);
  bool gpu = false;
  if (trainer.device == "auto") {
    gpu = ResourcePool::wants_gpus("auto", demand, gpus_per_host);  // every pool fits, or all run on the CPU
  } else {
    // cpu or cuda (another value is a ValueError naming the key); with cuda a pool that alone
    // needs more than a host offers is refused here, pools that only fit apart by the allocator
    for (const PoolSpec* pool : used)
      (void)ResourcePool::wants_gpus(trainer.device, pool->workers_per_node,
                                     in_process ? std::vector<int>(pool->workers_per_node.size(), hosts[0].gpus)
                                                : gpus_per_host);
    gpu = trainer.device == "cuda";
  }
  GpuAllocator allocator(hosts);
  auto make_pool = [&](const PoolSpec& pool) {
    const auto& per_node = pool.workers_per_node;
    ResourcePool made =
        in_process ? ResourcePool(per_node, 10, gpu ? hosts[0].gpus : 8, gpu) : nodes->pool(per_node, gpu);
    with_key("trainer.device", [&] {
      allocator.assign(made, pool.name, in_process ? std::vector<size_t>(per_node.size(), 0) : std::vector<size_t>{});
      return 0;
    });
    return made;
  };

  for (const PoolSpec* pool : used) {
    std::vector<const RoleSpec*> placed;
    for (const auto& role : roles)
      if (role.enabled && role.pool == pool->name) placed.push_back(&role);
    const ResourcePool resources = make_pool(*pool);
    WorkerGroupOptions options = group_options;
    options.name_prefix = pool->name_prefix;
    if (pool->name == "global") {
      // verl's default placement: every role of the pool in one worker, one view per role
      std::vector<std::pair<std::string, WorkerSpec>> specs;
      std::vector<std::string> names;
      for (const RoleSpec* r : placed) {
        specs.emplace_back(r->name, WorkerSpec{r->worker_type, r->init_args});
        names.push_back(r->name);
      }
      bundle_.emplace(*runtime_, resources, colocated_spec(specs), options);
      for (auto& [name, view] : bundle_->spawn(names)) groups_.emplace(name, std::move(view));
      continue;
    }
    for (const RoleSpec* r : placed)
      groups_.emplace(r->name, WorkerGroup(*runtime_, resources, WorkerSpec{r->worker_type, r->init_args}, options));
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
