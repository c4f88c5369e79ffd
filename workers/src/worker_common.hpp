#pragma once
// Pieces shared by the role workers: argument checks, meta_info reads, devices and the
// checkpoint directory layout.

#include <hyflow/actors/worker.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <c10/core/Device.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::workers::detail {

/// The process group of `worker`'s worker group, owned by its WorkerHost: created on first use
/// (a rendezvous: every rank must call it) and shared by every role hosted in the same worker,
/// so colocated roles do not each bind the master port. Null for a world size of 1.
std::shared_ptr<parallel::ProcessGroup> process_group_of(const Worker& worker);

/// KeyError "<method>: the batch lacks the tensor '<key>' (has: ...)" for the first missing key.
void require_keys(const DataProto& data, const std::vector<std::string>& keys, const std::string& method);

/// meta_info[key] as T when present (ValueError naming the key on a wrong type), else `fallback`.
double meta_double(const DataProto& data, const std::string& key, double fallback, const std::string& method);
int64_t meta_int(const DataProto& data, const std::string& key, int64_t fallback, const std::string& method);
bool meta_bool(const DataProto& data, const std::string& key, bool fallback, const std::string& method);

/// The torch device of a worker's device string ("cpu", "cuda:1"); CPU when CUDA is absent.
c10::Device resolve_device(const std::string& device);

/// The selected tensors of `data` on `device` (a new DataProto; `data` is untouched).
DataProto on_device(const DataProto& data, const std::vector<std::string>& keys, const c10::Device& device);

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
