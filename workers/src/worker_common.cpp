#include "worker_common.hpp"

#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <optional>

namespace hyflow::workers::detail {

parallel::ProcessGroupOptions process_group_options(const WorkerEnv& env, const c10::Device& device, bool nccl,
                                                    std::chrono::milliseconds collective_timeout) {
  const bool on_nccl = nccl && device.is_cuda();
  return {.rank = env.rank,
          .world_size = env.world_size,
          .master_addr = env.master_addr,
          .master_port = env.master_port,
          .bind_addr = env.node.substr(0, env.node.rfind(':')),  // the node's own host ("" in process)
          .store_token = env.store_token,
          .node = env.node,
          .backend = on_nccl ? parallel::Backend::nccl : parallel::Backend::gloo,
          .collective_timeout = collective_timeout,
          .name = "hyflow.workers",
          .device = on_nccl ? (device.has_index() ? device.index() : 0) : -1};
}

std::shared_ptr<parallel::ProcessGroup> host_group(
    actors::WorkerHost& host, const GroupTimeout& timeout,
    const std::function<std::shared_ptr<parallel::ProcessGroup>(const GroupTimeout&)>& make) {
  auto held = host.get_or_create<HostGroup>([&] {
    return std::make_shared<HostGroup>(HostGroup{make(timeout), timeout});
  });
  if (held->timeout.seconds != timeout.seconds) {
    throw ValueError("config key '" + timeout.key + "' is " + std::to_string(timeout.seconds.count()) +
                     " s, but this worker's process group was made with '" + held->timeout.key +
                     "' = " + std::to_string(held->timeout.seconds.count()) +
                     " s: the roles of one worker share its group and its NCCL timeout; set them equal");
  }
  return held->group;
}

std::shared_ptr<parallel::ProcessGroup> process_group_of(const Worker& worker, const GroupTimeout& timeout) {
  if (worker.world_size() <= 1) return nullptr;
  return host_group(worker.host(), timeout, [&](const GroupTimeout& t) {
    return std::make_shared<parallel::ProcessGroup>(process_group_options(
        worker.env(), resolve_device(worker.env().device), parallel::nccl_available(), t.seconds));
  });
}

void require_keys(const DataProto& data, const std::vector<std::string>& keys, const std::string& method) {
  for (const auto& key : keys) {
    if (data.batch.contains(key)) continue;
    std::string have;
    for (const auto& k : data.batch.keys()) have += (have.empty() ? "" : ", ") + k;
    throw KeyError(method + ": the batch lacks the tensor '" + key + "' (has: " + have + ")");
  }
}

namespace {
const Json* meta_entry(const DataProto& data, const std::string& key) {
  if (!data.meta_info.is_object() || !data.meta_info.contains(key) || data.meta_info.at(key).is_null()) return nullptr;
  return &data.meta_info.at(key);
}
[[noreturn]] void bad_meta(const std::string& method, const std::string& key, const Json& v, const char* wanted) {
  throw ValueError(method + ": meta_info['" + key + "'] must be " + wanted + ", got " + v.dump());
}
}  // namespace

double meta_double(const DataProto& data, const std::string& key, double fallback, const std::string& method) {
  const Json* v = meta_entry(data, key);
  if (!v) return fallback;
  if (!v->is_number()) bad_meta(method, key, *v, "a number");
  return v->get<double>();
}

int64_t meta_int(const DataProto& data, const std::string& key, int64_t fallback, const std::string& method) {
  const Json* v = meta_entry(data, key);
  if (!v) return fallback;
  if (!v->is_number_integer()) bad_meta(method, key, *v, "an integer");
  return v->get<int64_t>();
}

bool meta_bool(const DataProto& data, const std::string& key, bool fallback, const std::string& method) {
  const Json* v = meta_entry(data, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad_meta(method, key, *v, "a boolean");
  return v->get<bool>();
}

std::vector<std::string> visible_devices(const char* cuda_visible_devices) {
  std::vector<std::string> out;
  if (cuda_visible_devices == nullptr) return out;
  std::string entry;
  for (const char* c = cuda_visible_devices;; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!entry.empty()) out.push_back(entry);
      entry.clear();
      if (*c == '\0') break;
    } else if (*c != ' ') {
      entry += *c;
    }
  }
  return out;
}

WorkerDevice worker_device(const std::string& device, int64_t cuda_devices, const std::vector<std::string>& visible) {
  const std::string requested = device.empty() ? std::string("cpu") : device;
  if (requested == "auto") {
    return cuda_devices > 0 ? worker_device("cuda:0", cuda_devices, visible) : WorkerDevice{};
  }
  std::optional<c10::Device> parsed;
  try {
    parsed.emplace(requested);
  } catch (const std::exception&) {
    throw ValueError("worker device '" + requested + "' (trainer.device): expected cpu, auto, cuda or cuda:<index>");
  }
  if (parsed->is_cpu()) return WorkerDevice{};
  if (!parsed->is_cuda()) {
    throw ValueError("worker device '" + requested + "' (trainer.device): only cpu and cuda devices are supported");
  }
  const auto env = [&] {
    std::string list;
    for (const auto& v : visible) list += (list.empty() ? "" : ",") + v;
    return visible.empty() ? std::string("CUDA_VISIBLE_DEVICES unset") : "CUDA_VISIBLE_DEVICES=" + list;
  };
  if (cuda_devices <= 0) {
    throw ValueError("worker device '" + requested +
                     "' (trainer.device=cuda): no CUDA device is visible to this "
                     "process (" +
                     env() + ", " + std::to_string(cuda_devices) +
                     " devices); set trainer.device=cpu, or auto to use GPUs only where present");
  }
  const int64_t index = parsed->has_index() ? parsed->index() : 0;
  if (index >= cuda_devices) {
    throw ValueError("worker device '" + requested + "': this process sees " + std::to_string(cuda_devices) +
                     " CUDA device(s) (" + env() + "); local rank " + std::to_string(index) +
                     " has none (lower trainer.n_gpus_per_node or widen CUDA_VISIBLE_DEVICES)");
  }
  const auto i = static_cast<size_t>(index);
  return WorkerDevice{c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)),
                      i < visible.size() ? visible[i] : std::to_string(index)};
}

c10::Device resolve_device(const std::string& device) {
  const int64_t count = torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  return worker_device(device, count, visible_devices(std::getenv("CUDA_VISIBLE_DEVICES"))).device;
}

DataProto on_device(const DataProto& data, const std::vector<std::string>& keys, const c10::Device& device) {
  TensorDict out;
  for (const auto& k : keys) {
    if (!data.batch.contains(k)) continue;
    const auto& t = data.batch.at(k);
    if (device.is_cpu() || t.device() == device) {
      out.set(k, t.to(device));  // a no-op for a tensor already there
    } else if (t.device().is_cpu()) {
      out.set(k, (t.is_pinned() ? t : t.pin_memory()).to(device, /*non_blocking=*/true));
    } else {
      out.set(k, t.to(device));
    }
  }
  return DataProto(std::move(out), {}, data.meta_info);
}

DataProto& to_host(DataProto& data) {
  for (const auto& key : data.batch.keys()) {
    const auto& t = data.batch.at(key);
    if (!t.device().is_cpu()) data.batch.set(key, t.to(c10::Device(c10::kCPU)));
  }
  return data;
}

std::filesystem::path optimizer_file(const std::filesystem::path& dir, int rank, int world_size) {
  return dir / ("optim_world_size_" + std::to_string(world_size) + "_rank_" + std::to_string(rank) + ".pt");
}

std::filesystem::path rng_file(const std::filesystem::path& dir, int rank, int world_size) {
  return dir / ("extra_state_world_size_" + std::to_string(world_size) + "_rank_" + std::to_string(rank) + ".pt");
}

std::filesystem::path state_file(const std::filesystem::path& dir) { return dir / "hyflow_worker_state.json"; }

void copy_tokenizer_files(const std::filesystem::path& model_dir, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  if (fs::equivalent(model_dir, dir)) return;
  for (const auto& entry : fs::directory_iterator(model_dir)) {
    if (!entry.is_regular_file()) continue;
    const auto name = entry.path().filename().string();
    if (name == "config.json" || name == "model.safetensors.index.json" || entry.path().extension() == ".safetensors")
      continue;
    fs::copy_file(entry.path(), dir / name, fs::copy_options::overwrite_existing);
  }
}

void write_state(const std::filesystem::path& dir, const std::string& worker, int world_size, int64_t global_step,
                 bool sharded) {
  std::ofstream out(state_file(dir));
  out << Json{{"worker", worker},
              {"world_size", world_size},
              {"layout", sharded ? "sharded" : "replicated"},
              {"global_step", global_step}}
             .dump(2)
      << "\n";
  if (!out) throw Error("cannot write '" + state_file(dir).string() + "'");
}

int check_state(const std::filesystem::path& dir, const std::string& worker, int world_size, bool any_world_size) {
  const auto file = state_file(dir);
  std::ifstream in(file);
  if (!in) throw FormatError("checkpoint '" + dir.string() + "' has no " + file.filename().string());
  Json state;
  try {
    in >> state;
  } catch (const Json::exception& e) {
    throw FormatError("checkpoint state '" + file.string() + "' is not JSON: " + e.what());
  }
  if (!state.is_object() || !state.contains("worker") || !state.contains("world_size"))
    throw FormatError("checkpoint state '" + file.string() + "' lacks 'worker' or 'world_size'");
  if (state.at("worker") != worker)
    throw ValueError("checkpoint '" + dir.string() + "' was written by " + state.at("worker").dump() + ", not " +
                     worker);
  if (!state.at("world_size").is_number_integer())
    throw FormatError("checkpoint state '" + file.string() + "': 'world_size' is not an integer");
  if (!any_world_size && state.at("world_size") != world_size)
    throw ValueError("checkpoint '" + dir.string() + "' was written by " + state.at("world_size").dump() +
                     " workers; this group has " + std::to_string(world_size) +
                     " (only a sharded checkpoint loads at another world size)");
  return state.at("world_size").get<int>();
}

nlohmann::json metrics_json(const std::vector<std::pair<std::string, std::vector<double>>>& metrics) {
  Json out = Json::object();
  for (const auto& [name, values] : metrics) out[name] = values;
  return out;
}

}  // namespace hyflow::workers::detail
