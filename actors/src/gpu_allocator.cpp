#include <hyflow/actors/gpu_allocator.hpp>

#include <hyflow/core/error.hpp>

#include <algorithm>
#include <map>

namespace hyflow::actors {

GpuAllocator::GpuAllocator(std::vector<Host> hosts) : hosts_(std::move(hosts)) {
  for (const auto& h : hosts_) {
    if (h.gpus < 0) throw ValueError("GpuAllocator: host '" + h.name + "' has " + std::to_string(h.gpus) + " GPUs");
    owner_.emplace_back(static_cast<size_t>(h.gpus));
  }
}

int GpuAllocator::free(size_t host) const {
  if (host >= owner_.size())
    throw ValueError("GpuAllocator: no host " + std::to_string(host) + " (" + std::to_string(owner_.size()) +
                     " hosts)");
  return static_cast<int>(std::count(owner_[host].begin(), owner_[host].end(), std::string()));
}

namespace {
/// "pool 'global' holds cuda:0, cuda:1; pool 'ref' holds cuda:2", or "no pool holds any".
std::string holders(const std::vector<std::string>& owners) {
  std::map<std::string, std::string> held;  // pool -> its devices
  for (size_t d = 0; d < owners.size(); ++d)
    if (!owners[d].empty()) {
      auto& list = held[owners[d]];
      list += (list.empty() ? "cuda:" : ", cuda:") + std::to_string(d);
    }
  std::string out;
  for (const auto& [pool, list] : held) out += (out.empty() ? "pool '" : "; pool '") + pool + "' holds " + list;
  return out.empty() ? "no pool holds any" : out;
}
}  // namespace

void GpuAllocator::assign(ResourcePool& pool, const std::string& pool_name, const std::vector<size_t>& host_of_node) {
  if (!pool.use_gpu()) return;
  const auto& nodes = pool.store();
  if (!host_of_node.empty() && host_of_node.size() != nodes.size())
    throw ValueError("GpuAllocator: pool '" + pool_name + "' has " + std::to_string(nodes.size()) + " nodes, " +
                     std::to_string(host_of_node.size()) + " hosts given");
  auto owners = owner_;  // taken on a copy: a refusal takes nothing
  std::vector<std::vector<int>> devices(nodes.size());
  for (size_t node = 0; node < nodes.size(); ++node) {
    const size_t host = host_of_node.empty() ? node : host_of_node[node];
    if (host >= hosts_.size())
      throw ValueError("GpuAllocator: pool '" + pool_name + "' node " + std::to_string(node) + " is on host " +
                       std::to_string(host) + ", there are " + std::to_string(hosts_.size()));
    auto& on_host = owners[host];
    const auto before = on_host;
    for (size_t d = 0; d < on_host.size() && static_cast<int>(devices[node].size()) < nodes[node]; ++d)
      if (on_host[d].empty()) {
        on_host[d] = pool_name;
        devices[node].push_back(static_cast<int>(d));
      }
    if (static_cast<int>(devices[node].size()) < nodes[node]) {
      // names what holds the host's devices, this pool's earlier nodes included
      throw ValueError("resource pool '" + pool_name + "' needs " + std::to_string(nodes[node]) + " GPU(s) for node " +
                       std::to_string(node) + " on " + hosts_[host].name + ", which has " +
                       std::to_string(hosts_[host].gpus) + " CUDA device(s): " + holders(before) +
                       " (pools on one host get disjoint GPUs)");
    }
  }
  pool.set_devices(std::move(devices));
  owner_ = std::move(owners);
}

}  // namespace hyflow::actors
