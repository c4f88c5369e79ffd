#include <hyflow/actors/resource_pool.hpp>

#include <algorithm>
#include <functional>
#include <numeric>

namespace hyflow::actors {

namespace {
std::string list_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
}  // namespace

ResourcePool::ResourcePool(std::vector<int> process_on_nodes, int max_colocate_count, int n_gpus_per_node, bool use_gpu)
    : process_on_nodes_(std::move(process_on_nodes)), max_colocate_count_(max_colocate_count),
      n_gpus_per_node_(n_gpus_per_node), use_gpu_(use_gpu) {
  for (size_t i = 0; i < process_on_nodes_.size(); ++i)
    if (process_on_nodes_[i] <= 0)
      throw ValueError("ResourcePool: node " + std::to_string(i) + " has " + std::to_string(process_on_nodes_[i]) +
                       " processes in " + list_str(process_on_nodes_) + " (must be positive)");
  if (max_colocate_count <= 0) throw ValueError("ResourcePool: max_colocate_count must be positive");
  if (use_gpu)
    for (size_t i = 0; i < process_on_nodes_.size(); ++i)
      if (process_on_nodes_[i] > n_gpus_per_node)
        throw ValueError("ResourcePool: node " + std::to_string(i) + " asks for " +
                         std::to_string(process_on_nodes_[i]) +
                         " GPU workers but has n_gpus_per_node=" + std::to_string(n_gpus_per_node));
}

int ResourcePool::world_size() const { return std::accumulate(process_on_nodes_.begin(), process_on_nodes_.end(), 0); }

std::vector<int> ResourcePool::local_world_size_list() const {
  std::vector<int> out;
  for (int n : process_on_nodes_) out.insert(out.end(), static_cast<size_t>(n), n);
  return out;
}

std::vector<int> ResourcePool::local_rank_list() const {
  std::vector<int> out;
  for (int n : process_on_nodes_)
    for (int r = 0; r < n; ++r) out.push_back(r);
  return out;
}

void ResourcePool::add_node(int process_count) {
  if (process_count <= 0) throw ValueError("ResourcePool::add_node: process count must be positive");
  if (!devices_.empty()) throw ValueError("ResourcePool::add_node: the pool's devices are assigned already");
  process_on_nodes_.push_back(process_count);
}

void ResourcePool::set_devices(std::vector<std::vector<int>> devices) {
  if (!use_gpu_)
    throw ValueError("ResourcePool::set_devices: the pool " + list_str(process_on_nodes_) + " has no GPUs");
  if (devices.size() != process_on_nodes_.size())
    throw ValueError("ResourcePool::set_devices: " + std::to_string(devices.size()) +
                     " nodes of devices for a pool of " + std::to_string(process_on_nodes_.size()) + " nodes " +
                     list_str(process_on_nodes_));
  for (size_t i = 0; i < devices.size(); ++i)
    if (static_cast<int>(devices[i].size()) != process_on_nodes_[i])
      throw ValueError("ResourcePool::set_devices: node " + std::to_string(i) + " gets " + list_str(devices[i]) +
                       " for its " + std::to_string(process_on_nodes_[i]) + " workers");
  devices_ = std::move(devices);
}

bool ResourcePool::wants_gpus(const std::string& device, const std::vector<int>& workers_per_node,
                              const std::vector<int>& gpus_per_node, const std::string& key) {
  if (device == "cpu") return false;
  if (device != "cuda" && device != "auto")
    throw ValueError("config key '" + key + "' must be cpu, cuda or auto, got '" + device + "'");
  for (size_t i = 0; i < workers_per_node.size(); ++i) {
    const int gpus = i < gpus_per_node.size() ? gpus_per_node[i] : 0;
    if (gpus >= workers_per_node[i]) continue;
    if (device == "auto") return false;
    throw ValueError("config key '" + key + "' is cuda, but node " + std::to_string(i) + " offers " +
                     std::to_string(gpus) + " CUDA device(s) for its " + std::to_string(workers_per_node[i]) +
                     " workers (one each; nodes offer " + list_str(gpus_per_node) + ")");
  }
  return true;
}

std::vector<WorkerEnv> ResourcePool::place(const std::string& name_prefix, const std::string& type,
                                           const std::string& master_addr, int master_port) const {
  std::vector<WorkerEnv> out;
  const int ws = world_size();
  int rank = 0;
  for (size_t node = 0; node < process_on_nodes_.size(); ++node)
    for (int local = 0; local < process_on_nodes_[node]; ++local) {
      WorkerEnv e;
      e.rank = rank++;
      e.world_size = ws;
      e.local_rank = local;
      e.local_world_size = process_on_nodes_[node];
      e.master_addr = master_addr;
      e.master_port = master_port;
      const int index = devices_.empty() ? local : devices_[node][static_cast<size_t>(local)];
      e.device = use_gpu_ ? "cuda:" + std::to_string(index) : "cpu";
      e.name = name_prefix + type + "_" + std::to_string(node) + ":" + std::to_string(local);
      out.push_back(std::move(e));
    }
  return out;
}

ResourcePoolManager::ResourcePoolManager(std::map<std::string, std::vector<int>> spec,
                                         std::map<std::string, std::string> mapping, int max_colocate_count,
                                         int n_gpus_per_node, bool use_gpu)
    : spec_(std::move(spec)), mapping_(std::move(mapping)), max_colocate_count_(max_colocate_count),
      n_gpus_per_node_(n_gpus_per_node), use_gpu_(use_gpu) {
  for (const auto& [role, pool] : mapping_)
    if (!spec_.count(pool))
      throw KeyError("ResourcePoolManager: role '" + role + "' maps to pool '" + pool + "', which is not in the spec");
}

void ResourcePoolManager::create_resource_pools() {
  pools_.clear();
  for (const auto& [name, nodes] : spec_)
    pools_.emplace(name, ResourcePool(nodes, max_colocate_count_, n_gpus_per_node_, use_gpu_));
}

ResourcePool& ResourcePoolManager::get_resource_pool(const std::string& role) {
  auto it = mapping_.find(role);
  if (it == mapping_.end()) throw KeyError("ResourcePoolManager: no pool for role '" + role + "'");
  auto pool = pools_.find(it->second);
  if (pool == pools_.end())
    throw KeyError("ResourcePoolManager: pool '" + it->second + "' of role '" + role +
                   "' is not created yet (call create_resource_pools)");
  return pool->second;
}

int ResourcePoolManager::get_n_gpus() const {
  int n = 0;
  for (const auto& [name, nodes] : spec_) n += std::accumulate(nodes.begin(), nodes.end(), 0);
  return n;
}

void ResourcePoolManager::check_resources(const std::vector<int>& available_per_node) const {
  const int total = std::accumulate(available_per_node.begin(), available_per_node.end(), 0);
  if (total < get_n_gpus())
    throw ValueError("resource check: the pools need " + std::to_string(get_n_gpus()) +
                     " devices in total, the nodes " + list_str(available_per_node) + " offer " +
                     std::to_string(total));
  // Each pool's per-node demand must fit on distinct nodes; place the largest demands first
  // on the nodes with the most free devices (pools are packed one after another).
  std::vector<int> free = available_per_node;
  for (const auto& [name, nodes] : spec_) {
    std::vector<int> demand = nodes;
    std::sort(demand.begin(), demand.end(), std::greater<>());
    std::vector<size_t> order(free.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return free[a] > free[b]; });
    if (demand.size() > free.size())
      throw ValueError("resource check: pool '" + name + "' " + list_str(nodes) + " needs " +
                       std::to_string(demand.size()) + " nodes, only " + std::to_string(free.size()) + " available");
    for (size_t i = 0; i < demand.size(); ++i) {
      if (free[order[i]] < demand[i])
        throw ValueError("resource check: pool '" + name + "' " + list_str(nodes) + " needs " +
                         std::to_string(demand[i]) + " devices on one node, the best remaining node has " +
                         std::to_string(free[order[i]]) + " (nodes offer " + list_str(available_per_node) + ")");
      free[order[i]] -= demand[i];
    }
  }
}

}  // namespace hyflow::actors
