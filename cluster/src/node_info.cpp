// NodeInfo, node addresses, this machine's description, and the cluster's log line.
#include "detail.hpp"
#include "node_gpus.hpp"

#include <caf/all.hpp>

#include <torch/cuda.h>

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

namespace hyflow::cluster {
namespace detail {

caf::error node_error(std::string text) {
  return caf::error(1, caf::atom("hfnode"), caf::make_message(std::move(text)));
}

std::string error_text(caf::actor_system& sys, const caf::error& e) {
  if (e.category() == caf::atom("hfnode") || e.category() == caf::atom("hyflow")) {
    const auto& ctx = e.context();
    std::string out;
    for (size_t i = 0; i < ctx.size(); ++i)
      if (ctx.match_element<std::string>(i)) out += (out.empty() ? "" : ": ") + ctx.get_as<std::string>(i);
    if (!out.empty()) return out;
  }
  return sys.render(e);
}

std::pair<std::string, int> split_address(const std::string& addr) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())
    throw ValueError("cluster node '" + addr + "' is not host:port");
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(addr.substr(colon + 1), &used);
    if (used != addr.size() - colon - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw ValueError("cluster node '" + addr + "': port '" + addr.substr(colon + 1) + "' is not a number");
  }
  if (port <= 0 || port > 65535) throw ValueError("cluster node '" + addr + "': port out of range");
  return {addr.substr(0, colon), port};
}

NodeInfo local_node_info() {
  NodeInfo info;
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) == 0) info.hostname = host;
  info.cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#ifdef HYFLOW_CLUSTER_CUDA
  fill_cuda_devices(info);  // count, names, memory (cluster_gpu_cuda.cpp)
#else
  // Without HYFLOW_CUDA the CUDA runtime is not linked: LibTorch's count, no names or memory.
  info.gpus = static_cast<int>(torch::cuda::device_count());
#endif
  info.protocol_version = kNodeProtocolVersion;
  return info;
}

}  // namespace detail

using detail::split_address;

Json NodeInfo::to_json() const {
  return Json{{"address", address},
              {"hostname", hostname},
              {"cpus", cpus},
              {"gpus", gpus},
              {"gpu_names", gpu_names},
              {"gpu_memory_bytes", gpu_memory_bytes},
              {"protocol_version", protocol_version}};
}

NodeInfo NodeInfo::from_json(const Json& j) {
  NodeInfo n;
  n.address = j.value("address", "");
  n.hostname = j.value("hostname", "");
  n.cpus = j.value("cpus", 0);
  n.gpus = j.value("gpus", 0);
  n.gpu_names = j.value("gpu_names", std::vector<std::string>{});
  n.gpu_memory_bytes = j.value("gpu_memory_bytes", std::vector<int64_t>{});
  n.protocol_version = j.value("protocol_version", 0u);
  return n;
}

std::vector<std::string> parse_node_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    split_address(item);  // validates
    out.push_back(item);
  }
  if (out.empty()) throw ValueError("cluster.nodes: no node in '" + list + "'");
  return out;
}

void cluster_log(const std::string& text) {
  static std::mutex m;
  const auto now = std::chrono::system_clock::now();
  const auto t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::ostringstream os;
  os << std::put_time(&tm, "%Y-%m-%dT%H:%M:%S") << '.' << std::setw(3) << std::setfill('0') << ms << "Z [caf-node] "
     << text << '\n';
  std::lock_guard lock(m);
  std::cerr << os.str() << std::flush;
}

}  // namespace hyflow::cluster
