#pragma once
// Pieces shared by the role workers: argument checks, meta_info reads, devices and the
// checkpoint directory layout.

#include <hyflow/actors/worker.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <c10/core/Device.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::workers::detail {

/// The options of a worker's process group (verl's "cpu:gloo,cuda:nccl"): gloo for a CPU
/// worker; for a worker on cuda:<k> in a build with NCCL (`nccl`), backend nccl with device k,
/// the worker's own device, whose group also joins a gloo group for CPU tensors and control.
/// A CUDA worker in a build without NCCL stays on gloo.
/// `collective_timeout`: the NCCL watchdog's (verl's nccl_timeout).
parallel::ProcessGroupOptions process_group_options(
    const WorkerEnv& env, const c10::Device& device, bool nccl,
    std::chrono::milliseconds collective_timeout = std::chrono::seconds(600));

/// The nccl_timeout a role asks of its worker's group, and the config key it comes from.
struct GroupTimeout {
  std::chrono::seconds seconds{600};
  std::string key;  ///< e.g. "actor_rollout_ref.nccl_timeout"
};

/// The group a WorkerHost keeps for its roles, with the timeout it was created with.
struct HostGroup {
  std::shared_ptr<parallel::ProcessGroup> group;
  GroupTimeout timeout;
};

/// The group of `host`, made by `make(timeout)` for the first role that asks; every later role
/// must ask for the same timeout (ValueError naming both keys and values otherwise): the roles
/// of one worker share one group, whose watchdog has one timeout.
std::shared_ptr<parallel::ProcessGroup> host_group(
    actors::WorkerHost& host, const GroupTimeout& timeout,
    const std::function<std::shared_ptr<parallel::ProcessGroup>(const GroupTimeout&)>& make);

/// The process group of `worker`'s worker group (process_group_options with the worker's
/// device and `timeout`), owned by its WorkerHost: created on first use (a rendezvous: every
/// rank must call it) and shared by every role hosted in the same worker, so colocated roles do
/// not each bind the master port (host_group). Null for a world size of 1.
std::shared_ptr<parallel::ProcessGroup> process_group_of(const Worker& worker, const GroupTimeout& timeout);

/// KeyError "<method>: the batch lacks the tensor '<key>' (has: ...)" for the first missing key.
void require_keys(const DataProto& data, const std::vector<std::string>& keys, const std::string& method);

/// meta_info[key] as T when present (ValueError naming the key on a wrong type), else `fallback`.
double meta_double(const DataProto& data, const std::string& key, double fallback, const std::string& method);
int64_t meta_int(const DataProto& data, const std::string& key, int64_t fallback, const std::string& method);
bool meta_bool(const DataProto& data, const std::string& key, bool fallback, const std::string& method);

/// A worker's device and the physical GPU behind it.
struct WorkerDevice {
  c10::Device device{c10::kCPU};
  std::string physical;  ///< the CUDA_VISIBLE_DEVICES entry of a CUDA device ("3", "GPU-<uuid>"); empty for the CPU
};

/// The entries of a CUDA_VISIBLE_DEVICES value ("0,2,3" -> {"0", "2", "3"}); empty when unset.
std::vector<std::string> visible_devices(const char* cuda_visible_devices);

/// The device of a worker's device string, a pure function of what this process sees:
/// "cpu" (or empty) is the CPU; "auto" is cuda:0 when a CUDA device is visible, else the CPU;
/// "cuda" is cuda:0 and "cuda:<i>" cuda:i (the resource pool hands out cuda:<local rank>). CUDA
/// indices are logical, CUDA_VISIBLE_DEVICES semantics: cuda:i is the i-th visible device,
/// `visible`[i] when the variable is set, else physical GPU i. `cuda_devices`: the CUDA
/// devices this process sees (torch::cuda::device_count()). Asking for a CUDA device without
/// one, or past the visible ones, is a ValueError naming trainer.device / n_gpus_per_node and
/// CUDA_VISIBLE_DEVICES.
WorkerDevice worker_device(const std::string& device, int64_t cuda_devices, const std::vector<std::string>& visible);

/// worker_device for this process (torch::cuda::device_count() and CUDA_VISIBLE_DEVICES).
c10::Device resolve_device(const std::string& device);

/// The selected tensors of `data` on `device` (a new DataProto with its meta_info; `data` is
/// untouched; absent keys are skipped). DataProto crosses the worker boundary on the host: for a
/// CPU device the tensors pass through as they are (no copy); for a CUDA device each host
/// tensor is staged in pinned memory and copied with non_blocking (ordered on the current
/// stream; the first host read of a result waits for it).
DataProto on_device(const DataProto& data, const std::vector<std::string>& keys, const c10::Device& device);

/// Every tensor of `data` on the host, in place (results leave the worker on the host).
/// Host tensors stay as they are.
DataProto& to_host(DataProto& data);

/// Per-rank files of a worker checkpoint directory.
std::filesystem::path optimizer_file(const std::filesystem::path& dir, int rank, int world_size);
std::filesystem::path rng_file(const std::filesystem::path& dir, int rank, int world_size);
std::filesystem::path state_file(const std::filesystem::path& dir);

/// Copies tokenizer files (everything but config.json and safetensors) of model_dir into dir.
void copy_tokenizer_files(const std::filesystem::path& model_dir, const std::filesystem::path& dir);

/// Writes {"worker": ..., "world_size": ..., "layout": "sharded" | "replicated", "global_step": ...}
/// to state_file(dir).
void write_state(const std::filesystem::path& dir, const std::string& worker, int world_size, int64_t global_step,
                 bool sharded);
/// Reads state_file(dir), checks the worker type and (unless `any_world_size`) the world size
/// (FormatError / ValueError naming the file); returns the saved world size.
int check_state(const std::filesystem::path& dir, const std::string& worker, int world_size, bool any_world_size);

/// Metrics lists as a JSON object.
nlohmann::json metrics_json(const std::vector<std::pair<std::string, std::vector<double>>>& metrics);

}  // namespace hyflow::workers::detail
