#pragma once
// Sharded parameter checkpoints of an FsdpModule: each rank of the first replica writes its
// float32 master shards, rank 0 a manifest; loading at any world size and mesh reads only the
// rows a rank owns (load_sharded_parameters(module, dir)), and hyflow-model-merger turns the
// directory into a Hugging Face folder (load_sharded_parameters(dir): the full tensors).
//
// Layout of `dir`:
//   fsdp_manifest.json          {"format": "hyflow-fsdp-v1", "world_size", "mesh": {"shard_size",
//                               "replicate_size"}, "extra": <caller's JSON>, "parameters": [{"name",
//                               "shape", "dtype", "rows", "rows_per_shard", "offset"}], "shards":
//                               [{"shard_rank", "file", "bytes", "fnv1a64", "blocks"}]}: "blocks" the
//                               fnv1a64 of each parameter's block of the file (manifest order; in an
//                               optimizer file the exp_avg blocks, then the exp_avg_sq blocks)
//   model_shard_{r}_of_{S}.bin  rank r's master shards, float32 little-endian, in manifest order
//                               (parameter p at "offset" bytes, rows_per_shard x row_numel values)
//   optim_shard_{r}_of_{S}.bin  with optimizer state: rank r's AdamW exp_avg rows laid out as the
//                               model shard (parameter p at "offset"), then its exp_avg_sq rows
//                               (at the model shard's size + "offset"); the manifest's "optimizer"
//                               holds {"scheduler_steps", "steps": [per parameter], "shards": [...]}
// Files are written to a temporary name and renamed, so a crash leaves no partial file under
// the final name. Loading checks each file's size against the manifest, reads the blocks whose
// rows it needs by offset and checks each against its "blocks" checksum (a file listed without
// "blocks", from before they existed, is read and checked whole).

#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <vector>

namespace hyflow::parallel {

/// Writes this rank's part of a sharded checkpoint (see above) and waits for every rank of
/// `world` (null: one rank). `extra` goes into the manifest (e.g. {"config": config.json}).
/// Every rank of the group calls it.
void save_sharded_parameters(const FsdpModule& module, const std::filesystem::path& dir, const nlohmann::json& extra,
                             ProcessGroup* world);
/// save_sharded_parameters plus, when `optimizer` is set, its AdamW state per parameter rows
/// (optim_shard_*), so that loading at another world size reshards the optimizer too.
void save_sharded_checkpoint(const FsdpModule& module, const ShardedOptimizer* optimizer,
                             const std::filesystem::path& dir, const nlohmann::json& extra, ProcessGroup* world);

/// Whether `dir` holds a sharded checkpoint (its manifest exists).
bool is_sharded_checkpoint(const std::filesystem::path& dir);

/// The full float32 parameters of a sharded checkpoint (any world size), in manifest order,
/// and the manifest's "extra". FormatError naming the file (and the parameter or byte count)
/// when the manifest is malformed or a shard file is missing, truncated or fails its checksum.
std::vector<NamedParameter> load_sharded_parameters(const std::filesystem::path& dir, nlohmann::json* extra = nullptr);

/// Full (unsharded) AdamW state of a sharded checkpoint and the lr schedule position.
struct FullOptimizerState {
  std::vector<NamedAdamState> parameters;  ///< manifest order; moments shaped like the parameters
  int64_t scheduler_steps = 0;
};
/// The optimizer state of a sharded checkpoint (any world size); FormatError naming the file when
/// the manifest has none, or a file is missing, truncated or fails its checksum.
FullOptimizerState load_sharded_optimizer(const std::filesystem::path& dir);

/// Loads a sharded checkpoint (any world size and mesh) into `module`'s master shards, reading
/// only this rank's rows: from each saved shard file whose rows overlap its own, the blocks of
/// the parameters it needs, one at a time (the extra memory is one parameter's block, not the
/// model). FormatError naming the file (and the parameter and offset) when a file is missing,
/// short or fails a checksum; KeyError / ShapeError naming the parameter when the model differs.
void load_sharded_parameters(FsdpModule& module, const std::filesystem::path& dir);
/// The same for `optimizer` (on `module`): this rank's rows of exp_avg and exp_avg_sq, the step
/// counts and the lr schedule position; FormatError when the checkpoint has no optimizer state.
void load_sharded_optimizer(ShardedOptimizer& optimizer, const FsdpModule& module, const std::filesystem::path& dir);

}  // namespace hyflow::parallel
