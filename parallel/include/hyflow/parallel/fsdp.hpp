#pragma once
// Fully sharded data parallelism (FSDP2 style): every parameter is split along dim 0 into one
// contiguous slice per rank of its shard group (padded to a multiple of the group size), and
// parameters are grouped into units (one decoder layer each, plus a root unit). A unit's full
// parameters exist only while the unit computes: the model's forward loop brackets each unit
// with enter_unit / exit_unit, which gather the unit (the next unit's all-gather is already in
// flight), free it after forward (FULL_SHARD), gather it again before its backward and
// reduce-scatter its gradients (averaged over every rank) while the earlier units' backward
// runs. docs/parallel.md describes the model, the keys and what overlaps on CPU and GPU.

#include <hyflow/parallel/process_group.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace hyflow::parallel {

/// FULL_SHARD: shard parameters, gradients and optimizer state over all ranks; free a unit's
/// full parameters after its forward. SHARD_GRAD_OP: the same, but a unit stays gathered from
/// its forward to its backward. NO_SHARD: every rank holds everything (DDP: gradients
/// all-reduced). HYBRID_SHARD: FULL_SHARD inside groups of fsdp_size ranks, replicated across
/// the groups (a 2-D mesh).
enum class ShardingStrategy { full_shard, shard_grad_op, no_shard, hybrid_shard };
const char* to_string(ShardingStrategy strategy);

/// verl's fsdp_config.mixed_precision: the dtype units compute in (gathered parameters), the
/// dtype gradients are reduced in, and the dtype of buffers. Master shards, their gradients and
/// the optimizer state stay float32; gradients accumulated over micro-batches without gradient
/// sync are summed in float32 (docs/parallel.md, "Precision").
struct MixedPrecision {
  at::ScalarType param_dtype = at::kFloat;
  at::ScalarType reduce_dtype = at::kFloat;
  at::ScalarType buffer_dtype = at::kFloat;
};

/// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16" (verl's spellings); ValueError
/// naming `key` otherwise.
at::ScalarType parse_dtype(const std::string& name, const std::string& key);

/// verl's mixed_precision.buffer_dtype: casts `module`'s floating-point buffers (never its
/// parameters) to `dtype`; integer and bool buffers keep their dtype.
void cast_buffers(torch::nn::Module& module, at::ScalarType dtype);

/// The shard group and the replicate group of one rank: the 2-D mesh (replicate, shard) of
/// verl's create_device_mesh. A null group stands for a group of one rank.
struct DeviceMesh {
  std::shared_ptr<ProcessGroup> shard;
  std::shared_ptr<ProcessGroup> replicate;
  int shard_size() const { return shard ? shard->size() : 1; }
  int shard_rank() const { return shard ? shard->rank() : 0; }
  int replicate_size() const { return replicate ? replicate->size() : 1; }
};

/// verl's mesh for `fsdp_size` over `world` (null: one rank): fsdp_size < 0 or >= the world
/// size shards over all ranks; 1 replicates (NO_SHARD); otherwise shard groups of fsdp_size
/// consecutive ranks, replicated across them (HYBRID_SHARD; the world size must be a multiple,
/// else ValueError naming both). Sub-groups are created over `world`'s store (a rendezvous:
/// every rank calls it) under keys prefixed with `tag`, which must differ between the meshes
/// built on one group (e.g. the role: "actor", "ref", "critic").
DeviceMesh make_device_mesh(const std::shared_ptr<ProcessGroup>& world, int64_t fsdp_size,
                            const std::string& tag = "fsdp");

/// The strategy a mesh and reshard_after_forward give (verl derives it the same way).
ShardingStrategy strategy_of(const DeviceMesh& mesh, bool reshard_after_forward);

struct FsdpOptions {
  bool reshard_after_forward = true;  ///< false: SHARD_GRAD_OP
  MixedPrecision mixed_precision;
  /// verl's fsdp_config.param_offload: the float32 master shards and their gradients live in
  /// host memory (pinned) while the engine does not use them, and move to the device before a
  /// forward, a gather or the optimizer step. Shards in host memory already (a CPU model): a
  /// no-op, said once on stderr.
  bool param_offload = false;
  /// verl's fsdp_config.optimizer_offload: the ShardedOptimizer on this module keeps its AdamW
  /// moments in host memory (pinned) between steps (a no-op for CPU shards, said once).
  bool optimizer_offload = false;
  /// Testing only: offloading CPU shards (and moments) moves them to a separate host copy and
  /// back, the bookkeeping of the device path (training stays bit-identical).
  bool offload_cpu_copies = false;
};

/// Host memory for `t` (pinned when `t` is on a CUDA device) holding its values.
at::Tensor to_host_memory(const at::Tensor& t);

/// `t`'s values back on `device` after to_host_memory: a copy to a CUDA device, or a fresh CPU
/// copy (the offload_cpu_copies seam).
at::Tensor from_host_memory(const at::Tensor& t, const c10::Device& device);

/// Says once per process on stderr that `key` (param_offload, optimizer_offload) is a no-op for
/// shards in host memory already.
void note_offload_noop(const std::string& key);

/// A named parameter of the model, in the order of the model's named_parameters().
struct NamedParameter {
  std::string name;
  at::Tensor tensor;
};

/// One unit: the parameters gathered and freed together. Parameters without requires_grad are
/// frozen (LoRA's base weights): gathered for the forward and backward like the others, but their
/// gradients are never formed nor reduce-scattered, and the sharded optimizer skips them.
struct FsdpUnit {
  std::string name;
  std::vector<NamedParameter> parameters;
};

/// verl's wrap policy on a decoder LM: one unit per decoder layer ("<prefix>layers.<i>.")
/// when it has at least `min_num_params` parameters, everything else (embeddings, final norm,
/// heads, and layers below the threshold) in the root unit, which comes last.
std::vector<FsdpUnit> units_by_layer(const std::vector<NamedParameter>& parameters, int64_t min_num_params);

/// The sharding engine of one model on one rank. Construction shards every parameter (each
/// rank keeps its slice as a float32 master shard) and frees the full parameters, except with
/// a shard group of one (NO_SHARD), where parameters keep their storage.
class FsdpModule {
 public:
  FsdpModule(std::vector<FsdpUnit> units, DeviceMesh mesh, FsdpOptions options);
  ~FsdpModule();
  FsdpModule(const FsdpModule&) = delete;
  FsdpModule& operator=(const FsdpModule&) = delete;

  ShardingStrategy strategy() const;
  const FsdpOptions& options() const;
  const DeviceMesh& mesh() const;
  int num_units() const;
  /// The index of the root unit (the last one).
  int root_unit() const;
  const std::string& unit_name(int unit) const;
  /// The index of the unit named `name` ("model.layers.3"), -1 when there is none (a layer
  /// below wrap_policy.min_num_params lives in the root unit).
  int find_unit(const std::string& name) const;

  /// Before a forward pass: gathers the root unit and starts the all-gather of unit 0.
  void begin_forward();
  /// Around unit `unit`'s computation on activation `x`. enter_unit waits for the unit's
  /// all-gather and starts the next one's; in backward it reduces the unit's gradients and
  /// frees it. exit_unit frees the unit after forward (FULL_SHARD, or always without grad
  /// mode); in backward it gathers the unit again and prefetches the one before.
  at::Tensor enter_unit(int unit, const at::Tensor& x);
  at::Tensor exit_unit(int unit, const at::Tensor& x);
  /// After backward (or after a forward without grad): reduces what is left (the root, units
  /// whose input needs no gradient), waits for every reduction and frees every unit.
  void finish_backward();
  /// After a forward without grad mode: frees the root unit (and anything still gathered).
  void end_forward();
  /// The language-model head on a root-unit parameter `weight` (out x in, the model's tensor):
  /// returns forward(x), which must compute x @ weight^T (the model's own code, e.g.
  /// CausalLM::logits, so the outputs are bit-equal), run without autograd. In backward the engine
  /// computes x's gradient (which needs the full weight), releases the weight's full parameter
  /// (nothing after the head needs it: an embedding lookup's backward reads only the indices), and
  /// only then forms the weight's full gradient and reduce-scatters it at once (or, without
  /// gradient sync, adds it to weight.grad()): the root unit never holds its largest parameter
  /// and that parameter's full gradient together. A tied embedding's own gradient arrives in
  /// weight.grad() at the end of backward and is reduced by finish_backward into the same shard.
  /// Without grad mode (or when x needs no gradient) it is forward(x) on the gathered weight.
  /// ValueError when `weight` is not a parameter of the root unit.
  at::Tensor head(const at::Tensor& x, const at::Tensor& weight,
                  const std::function<at::Tensor(const at::Tensor&)>& forward);
  /// With param_offload: moves the master shards and their gradients to host memory / back to
  /// the model's device (the shards keep their identity: the optimizer's parameters follow).
  /// The engine calls them itself: onload before begin_forward, unshard_all,
  /// for_each_full_parameter and loading, offload after end_forward, reshard_all and loading;
  /// the sharded optimizer onloads before its step and offloads after. Otherwise nothing.
  void offload();
  void onload();
  /// Whether offload() moves memory (param_offload with shards on a CUDA device, or the
  /// testing copy); whether the shards are in host memory now.
  bool offload_moves() const;
  bool offloaded() const;

  /// Gradient accumulation: with false, backward keeps full gradients locally and communicates
  /// nothing; the next synchronized backward reduces the accumulated sum (verl's micro-batches).
  void set_requires_gradient_sync(bool sync);

  /// Gathers every unit (one at a time, the next in flight) and calls `use(name, full)` for
  /// each parameter in model order, freeing each unit after it: the rollout handoff and the
  /// full-weight export; never more than two units are gathered at once.
  void for_each_full_parameter(const std::function<void(const std::string&, const at::Tensor&)>& use);

  /// Gathers every unit into the model (one all-gather per unit, the next in flight): the
  /// colocated rollout and full-state checkpoints need the whole model. reshard_all() frees it.
  void unshard_all();
  void reshard_all();

  /// The float32 master shards (the optimizer's parameters), their reduced gradients in grad().
  std::vector<at::Tensor> local_shards() const;
  /// Names, full shapes and the rows this rank's shard holds, for checkpoints.
  struct ShardInfo {
    std::string name;
    std::vector<int64_t> full_shape;
    int64_t rows = 0;                   ///< dim 0 of the full parameter (1 for a scalar)
    int64_t rows_per_shard = 0;         ///< ceil(rows / shard size)
    at::ScalarType dtype = at::kFloat;  ///< the model parameter's dtype
    /// false for a parameter without requires_grad at construction (a LoRA base weight): its
    /// shard gets no gradient (nothing is reduced for it) and no optimizer state.
    bool trainable = true;
  };
  std::vector<ShardInfo> shard_infos() const;
  /// Copies full parameters (by name, as a state dict) into the local shards; ShapeError /
  /// KeyError naming the parameter when one is missing or has another shape.
  void load_full_parameters(const std::vector<NamedParameter>& full, const std::string& source);
  /// Loading without the full tensors: zeroes the master shards and calls fill(rows) with, per
  /// parameter (shard_infos order), a writable contiguous (real rows, row_numel) float32 host
  /// tensor for this rank's rows [r k, min((r + 1) k, rows)) of its shard (the shard's own rows
  /// on CPU, copied to the device after fill otherwise; padding rows stay zero); then the
  /// parameters show the loaded values (fsdp_checkpoint's row-range loader uses it).
  void load_local_rows(const std::function<void(const std::vector<at::Tensor>& rows)>& fill);

  /// Bytes this rank holds now: master shards + their gradients, and full parameters and
  /// gradients currently materialized.
  int64_t sharded_bytes() const;
  int64_t materialized_bytes() const;
  /// sharded_bytes() + materialized_bytes(): parameters and gradients this rank holds now
  /// (communication buffers are not counted).
  int64_t held_bytes() const;
  /// Most bytes of full parameters gathered at once since the last reset.
  int64_t peak_materialized_bytes() const;
  /// Most held_bytes() at once since the last reset, counting the full gradient head() forms in
  /// backward. The engine samples it wherever it allocates full tensors and before it releases
  /// any (autograd only adds gradients in between), so it is the true maximum of the count.
  int64_t peak_held_bytes() const;
  void reset_peak();

  struct Impl;  ///< opaque (public so that the engine's autograd boundaries can name it)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyflow::parallel
