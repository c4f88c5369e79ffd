#include <hyflow/core/error.hpp>
#include <hyflow/parallel/fsdp.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <utility>

namespace hyflow::parallel {

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::full_shard:
      return "FULL_SHARD";
    case ShardingStrategy::shard_grad_op:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::no_shard:
      return "NO_SHARD";
    case ShardingStrategy::hybrid_shard:
      return "HYBRID_SHARD";
  }
  return "?";
}

at::ScalarType parse_dtype(const std::string& name, const std::string& key) {
  if (name == "fp32" || name == "float32" || name == "float") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") return at::kHalf;
  throw ValueError("config key '" + key + "' must be one of fp32, bf16, fp16 (or float32, bfloat16, float16), got '" +
                   name + "'");
}

void cast_buffers(torch::nn::Module& module, at::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (auto& buffer : module.buffers())
    if (at::isFloatingType(buffer.scalar_type())) buffer.set_data(buffer.to(dtype));
}

DeviceMesh make_device_mesh(const std::shared_ptr<ProcessGroup>& world, int64_t fsdp_size, const std::string& tag) {
  DeviceMesh mesh;
  if (!world || world->size() == 1) return mesh;
  const int n = world->size();
  if (fsdp_size < 0 || fsdp_size >= n) {
    mesh.shard = world;
    return mesh;
  }
  if (fsdp_size == 0 || n % fsdp_size != 0) {
    throw ValueError("fsdp_config.fsdp_size " + std::to_string(fsdp_size) + " must divide the world size " +
                     std::to_string(n) + " (or be -1: shard over all ranks)");
  }
  const int f = static_cast<int>(fsdp_size), me = world->rank();
  if (f == 1) {
    mesh.replicate = world;
    return mesh;
  }
  // shard groups: consecutive ranks [k f, (k + 1) f); replicate groups: ranks with the same r mod f
  for (int k = 0; k < n / f; ++k) {
    std::vector<int> ranks;
    for (int i = 0; i < f; ++i) ranks.push_back(k * f + i);
    if (me / f == k) mesh.shard = world->new_subgroup(ranks, tag + "_shard_" + std::to_string(k));
  }
  for (int i = 0; i < f; ++i) {
    std::vector<int> ranks;
    for (int k = 0; k < n / f; ++k) ranks.push_back(k * f + i);
    if (me % f == i) mesh.replicate = world->new_subgroup(ranks, tag + "_replicate_" + std::to_string(i));
  }
  return mesh;
}

ShardingStrategy strategy_of(const DeviceMesh& mesh, bool reshard_after_forward) {
  if (mesh.shard_size() == 1) return ShardingStrategy::no_shard;
  if (mesh.replicate_size() > 1) return ShardingStrategy::hybrid_shard;
  return reshard_after_forward ? ShardingStrategy::full_shard : ShardingStrategy::shard_grad_op;
}

std::vector<FsdpUnit> units_by_layer(const std::vector<NamedParameter>& parameters, int64_t min_num_params) {
  static const std::regex layer_name(R"(^(.*\blayers\.(\d+))\..*$)");
  std::vector<FsdpUnit> layers;
  std::map<std::string, size_t> index;
  FsdpUnit root{"root", {}};
  std::vector<NamedParameter> unplaced;
  for (const auto& p : parameters) {
    std::smatch m;
    if (!std::regex_match(p.name, m, layer_name)) {
      root.parameters.push_back(p);
      continue;
    }
    auto [it, fresh] = index.try_emplace(m[1].str(), layers.size());
    if (fresh) layers.push_back(FsdpUnit{m[1].str(), {}});
    layers[it->second].parameters.push_back(p);
  }
  std::vector<FsdpUnit> units;
  for (auto& unit : layers) {
    int64_t count = 0;
    for (const auto& p : unit.parameters) count += p.tensor.numel();
    if (count >= min_num_params) {
      units.push_back(std::move(unit));
    } else {
      root.parameters.insert(root.parameters.end(), unit.parameters.begin(), unit.parameters.end());
    }
  }
  units.push_back(std::move(root));
  return units;
}

at::Tensor to_host_memory(const at::Tensor& t) {
  if (!t.is_cuda()) return t.clone();
  auto host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  host.copy_(t);
  return host;
}

at::Tensor from_host_memory(const at::Tensor& t, const c10::Device& device) {
  return device.is_cuda() ? t.to(device) : t.clone();
}

void note_offload_noop(const std::string& key) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard lock(mutex);
  if (!said.insert(key).second) return;
  std::cerr << "hyflow FSDP: " << key << " is a no-op here: the shards are in host (CPU) memory already\n";
}

namespace {

struct Param {
  std::string name;
  at::Tensor param;  // the model's tensor; its data is `full`
  at::Tensor full;   // the full parameter in the compute dtype; storage released while sharded
  std::vector<int64_t> full_shape;
  int64_t rows = 0, row_numel = 0, rows_per_shard = 0;
  at::ScalarType dtype = at::kFloat;
  at::Tensor shard;           // float32 master slice, (rows_per_shard * row_numel,)
  bool live = false;          // `full` has its storage (gathered, or replicated)
  int head_uses = 0;          // head() calls of this forward whose backward has not run
  bool head_reduced = false;  // head() reduced this parameter's gradient in this backward
  bool frozen = false;        // no requires_grad (LoRA's base): never reduced, never stepped
  // Low-precision compute: the float32 (rows, row_numel) sum of this parameter's gradients over
  // the micro-batches without gradient sync, taken from param.grad() after each unit's backward
  // (a bf16 param.grad() would round every addition); the synchronized backward reduces it.
  at::Tensor accum;
  // Replicated low-precision copies: the master's version counter when `full` was last cast from it
  // (-1: never, or the master moved), so that an unchanged master is not cast again.
  int64_t cast_version = -1;
  int64_t shard_numel() const { return rows_per_shard * row_numel; }
  size_t full_nbytes() const { return static_cast<size_t>(full.numel()) * full.element_size(); }
};

// a (n, k) @ b (m, k)^T -> (n, m). Float32 on CPU through oneDNN's inner product, as the
// models' linears (hyflow/cuda/linear.hpp) run it: Debian's LibTorch 1.13 runs GEMM on the
// reference BLAS, several times slower at the head's shapes.
at::Tensor matmul_nt(const at::Tensor& a, const at::Tensor& b) {
  if (at::hasMKLDNN() && a.is_cpu() && a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat)
    return at::mkldnn_linear(a.contiguous().to_mkldnn(), b.contiguous().to_mkldnn(), c10::nullopt).to_dense();
  return a.mm(b.t());
}

// A unit's storage is released in place, as FSDP does, so that tensors the autograd graph
// saved from a parameter (views such as weight.t()) lose their memory too and see the
// gathered values again when the storage is refilled before backward.
void release_storage(const at::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t, size_t nbytes) {
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

struct Unit {
  std::string name;
  std::vector<size_t> params;
  int64_t shard_numel = 0;
  bool gathered = false;
  bool backward_pending = false;  // gathered for a backward whose gradients are not reduced yet
  std::unique_ptr<Work> gather_work;
  at::Tensor gather_in, gather_out;
};

// A reduce-scatter in flight: the gradients of `params` (a unit's, or the head's one), reduced
// into shard-sized blocks in `out`, added to the shard gradients when waited for.
struct Reduction {
  std::vector<size_t> params;
  std::unique_ptr<Work> work;
  at::Tensor out;
};

}  // namespace

struct FsdpModule::Impl {
  DeviceMesh mesh;
  FsdpOptions options;
  ShardingStrategy strategy = ShardingStrategy::full_shard;
  std::vector<Param> params;
  std::vector<Unit> units;
  std::vector<Reduction> reductions;  // in flight, in issue order
  bool sync = true;
  int64_t materialized = 0, peak = 0;
  int64_t held_peak = 0;  // most sharded + materialized bytes (with the head's gradient) at once

  c10::Device device = at::kCPU;  // where the shards compute
  bool offloaded = false;         // the master shards (and gradients) are in host memory

  int S() const { return mesh.shard_size(); }
  // Parameters compute in a dtype below float32: autograd forms their gradients in it.
  bool low_precision() const { return options.mixed_precision.param_dtype != at::kFloat; }

  bool offload_moves() const { return options.param_offload && (device.is_cuda() || options.offload_cpu_copies); }

  // Moves every master shard and its gradient with `move`, keeping the tensors' identity (the
  // optimizer's parameters and its state keys); a replicated float32 parameter follows its shard.
  void move_shards(const std::function<at::Tensor(const at::Tensor&)>& move) {
    torch::NoGradGuard no_grad;
    for (auto& p : params) {
      p.shard.set_data(move(p.shard));
      p.cast_version = -1;
      if (p.shard.grad().defined()) p.shard.mutable_grad() = move(p.shard.grad());
      if (S() == 1 && options.mixed_precision.param_dtype == at::kFloat) {
        p.full = p.shard.view(p.full_shape);
        p.param.set_data(p.full);
      }
    }
  }

  void offload() {
    if (!options.param_offload || offloaded) return;
    if (!offload_moves()) {
      note_offload_noop("fsdp_config.param_offload");
      return;
    }
    move_shards([](const at::Tensor& t) { return to_host_memory(t); });
    offloaded = true;
  }

  void onload() {
    if (!offloaded) return;
    const auto target = device;
    move_shards([target](const at::Tensor& t) { return from_host_memory(t, target); });
    offloaded = false;
  }
  bool sharded() const { return S() > 1; }
  int root() const { return static_cast<int>(units.size()) - 1; }

  int64_t full_bytes(const Param& p) const {
    return p.rows * p.row_numel * static_cast<int64_t>(c10::elementSize(options.mixed_precision.param_dtype));
  }

  // Replicated (shard group of one): the parameter is the master shard (shared storage) in
  // float32, or a copy of it cast to the compute dtype, refreshed before each forward when the
  // master changed since its last cast (an optimizer step, a load: the master's version counter
  // moved). The cast writes through the model's parameter (whose data is `full`), so the
  // parameter's version counter moves exactly when its values may have: a merged LoRA copy or a
  // rollout engine that watches it re-merges / repacks it once per weight version.
  void materialize_replicated(Unit& u) {
    torch::NoGradGuard no_grad;
    for (size_t i : u.params) {
      auto& p = params[i];
      if (options.mixed_precision.param_dtype == at::kFloat) continue;  // shares the shard's storage
      if (p.cast_version == p.shard._version()) continue;
      p.param.detach().view({-1}).copy_(p.shard);
      p.cast_version = p.shard._version();
    }
    u.gathered = true;
  }

  void start_gather(int ui) {
    auto& u = units[static_cast<size_t>(ui)];
    if (u.gathered || u.gather_work) return;
    if (!sharded()) {
      materialize_replicated(u);
      return;
    }
    std::vector<at::Tensor> flat;
    for (size_t i : u.params) flat.push_back(params[i].shard.to(options.mixed_precision.param_dtype));
    u.gather_in = torch::cat(flat);
    u.gather_out = torch::empty({S() * u.shard_numel}, u.gather_in.options());
    u.gather_work = mesh.shard->all_gather_into_tensor_async(u.gather_out, u.gather_in);
  }

  void finish_gather(int ui) {
    auto& u = units[static_cast<size_t>(ui)];
    if (u.gathered) return;
    start_gather(ui);
    if (u.gathered) return;
    u.gather_work->wait();
    u.gather_work.reset();
    torch::NoGradGuard no_grad;
    auto blocks = u.gather_out.view({S(), u.shard_numel});  // (S, unit shard numel): rank r's slices
    int64_t offset = 0;
    for (size_t i : u.params) {
      auto& p = params[i];
      if (!p.live) {
        allocate_storage(p.full, p.full_nbytes());
        p.live = true;
        materialized += full_bytes(p);
      }
      auto rows = p.full.view({p.rows, p.row_numel});
      for (int r = 0; r < S(); ++r) {  // rank r holds rows [r k, (r + 1) k), the last ones padding
        const int64_t begin = std::min<int64_t>(r * p.rows_per_shard, p.rows);
        const int64_t count = std::min<int64_t>(begin + p.rows_per_shard, p.rows) - begin;
        if (count <= 0) continue;
        rows.narrow(0, begin, count).copy_(blocks[r].narrow(0, offset, count * p.row_numel).view({count, p.row_numel}));
      }
      offset += p.shard_numel();
    }
    u.gather_in.reset();
    u.gather_out.reset();
    u.gathered = true;
    peak = std::max(peak, materialized);
    note_held();
  }

  void release_param(size_t i) {
    auto& p = params[i];
    if (!sharded() || !p.live) return;
    release_storage(p.full);
    p.live = false;
    materialized -= full_bytes(p);
  }

  void free_unit(int ui) {
    auto& u = units[static_cast<size_t>(ui)];
    if (!sharded()) return;
    note_held();
    for (size_t i : u.params) release_param(i);
    u.gathered = false;
  }

  // Bytes of parameters and gradients held now (FsdpModule::held_bytes) plus `transient` (a full
  // gradient the engine formed outside param.grad), folded into held_peak. Autograd only adds
  // gradients between the engine's calls, and only the engine frees full parameters and
  // gradients, so sampling before every release and after every allocation sees each maximum.
  void note_held(int64_t transient = 0) {
    int64_t bytes = materialized + transient;
    for (const auto& p : params) {
      bytes += p.shard.numel() * 4;
      if (p.shard.grad().defined()) bytes += p.shard.grad().numel() * 4;
      if (p.param.grad().defined()) bytes += p.param.grad().numel() * p.param.grad().element_size();
      if (p.accum.defined()) bytes += p.accum.numel() * 4;
    }
    held_peak = std::max(held_peak, bytes);
  }

  // Reduce-scatter (average) of full gradients `grads` of `which` (in unit order) into
  // shard-sized blocks; replicas then average across the replicate group (in wait_reduce).
  void start_reduce(std::vector<size_t> which, std::vector<at::Tensor> grads) {
    torch::NoGradGuard no_grad;
    const auto dtype = options.mixed_precision.reduce_dtype;
    int64_t shard_numel = 0;
    std::vector<at::Tensor> blocks;
    for (size_t k = 0; k < which.size(); ++k) {
      auto& p = params[which[k]];
      at::Tensor g = grads[k].defined() ? grads[k].reshape({p.rows, p.row_numel}).to(dtype)
                                        : torch::zeros({p.rows, p.row_numel}, p.shard.options().dtype(dtype));
      grads[k].reset();
      const int64_t padded = S() * p.rows_per_shard;
      if (padded > p.rows) g = torch::cat({g, torch::zeros({padded - p.rows, p.row_numel}, g.options())});
      blocks.push_back(g.reshape({S(), p.shard_numel()}));
      shard_numel += p.shard_numel();
    }
    // (S * shard numel,) in rank-block order; a single block is its own buffer
    auto input = blocks.size() == 1 ? blocks[0].reshape({-1}) : torch::cat(blocks, 1).reshape({-1});
    blocks.clear();
    Reduction reduction{std::move(which), nullptr, {}};
    if (sharded()) {
      reduction.out = torch::empty({shard_numel}, input.options());
      reduction.work = mesh.shard->reduce_scatter_async(reduction.out, input, ReduceOp::avg);
    } else {
      reduction.out = input;  // the gradients were taken from their parameters
      if (mesh.replicate) reduction.work = mesh.replicate->all_reduce_async(reduction.out, ReduceOp::avg);
    }
    reductions.push_back(std::move(reduction));
  }

  // A unit's gradients: those in param.grad(), zeros for parameters without one, except the
  // parameters whose gradient head() reduced already in this backward (and nothing came since).
  void start_unit_reduce(int ui) {
    note_held();
    std::vector<size_t> which;
    std::vector<at::Tensor> grads;
    for (size_t i : units[static_cast<size_t>(ui)].params) {
      auto& p = params[i];
      if (p.frozen) continue;
      const bool taken = p.head_reduced && !p.param.grad().defined();
      p.head_reduced = false;
      if (taken) continue;
      which.push_back(i);
      grads.push_back(take_accumulated(p, p.param.grad()));
      p.param.mutable_grad().reset();
    }
    if (!which.empty()) start_reduce(std::move(which), std::move(grads));
  }

  // Adds gradient `g` (any dtype, the parameter's shape) to p.accum in float32.
  static void accumulate(Param& p, const at::Tensor& g) {
    torch::NoGradGuard no_grad;
    auto g32 = g.reshape({p.rows, p.row_numel}).to(at::kFloat);
    if (p.accum.defined()) {
      p.accum.add_(g32);
    } else {
      p.accum = g32.is_same(g) ? g32.clone() : g32;
    }
  }

  // `g` plus what earlier micro-batches accumulated (float32 then), emptying the accumulator.
  static at::Tensor take_accumulated(Param& p, const at::Tensor& g) {
    if (!p.accum.defined()) return g;
    if (g.defined()) accumulate(p, g);
    return std::exchange(p.accum, at::Tensor());
  }

  // Without gradient sync in low precision: the unit's gradients move into float32 accumulators.
  void accumulate_unit(int ui) {
    note_held();
    for (size_t i : units[static_cast<size_t>(ui)].params) {
      auto& p = params[i];
      if (p.frozen || !p.param.grad().defined()) continue;
      accumulate(p, p.param.grad());
      p.param.mutable_grad().reset();
    }
  }

  void wait_reduce(Reduction& reduction) {
    torch::NoGradGuard no_grad;
    if (reduction.work) reduction.work->wait();
    reduction.work.reset();
    if (sharded() && mesh.replicate) mesh.replicate->all_reduce(reduction.out, ReduceOp::avg);
    int64_t offset = 0;
    for (size_t i : reduction.params) {
      auto& p = params[i];
      auto g = reduction.out.narrow(0, offset, p.shard_numel()).to(at::kFloat);
      if (p.shard.grad().defined()) {
        p.shard.mutable_grad().add_(g);
      } else {
        p.shard.mutable_grad() = g.clone();
      }
      offset += p.shard_numel();
    }
    reduction.out.reset();
    note_held();
  }

  void post_backward(int ui) {
    auto& u = units[static_cast<size_t>(ui)];
    if (!u.backward_pending) return;
    u.backward_pending = false;
    if (sync) {
      start_unit_reduce(ui);
    } else if (low_precision()) {
      accumulate_unit(ui);
    }
    free_unit(ui);
  }

  void pre_backward(int ui) {
    // units after this one have finished their backward even when their input needed no grad
    for (int v = root() - 1; v > ui; --v) post_backward(v);
    finish_gather(ui);
    if (ui > 0) start_gather(ui - 1);
  }

  // The backward of head(): x's gradient needs the full weight, the weight's does not, so the
  // weight is released in between (when no other head() of this forward still needs it) and the
  // root never holds the weight and its full gradient together.
  at::Tensor head_backward(size_t i, const at::Tensor& grad, const at::Tensor& x) {
    torch::NoGradGuard no_grad;
    auto& p = params[i];
    const int64_t out_features = p.rows, in_features = p.row_numel;
    const auto dtype = p.full.scalar_type();  // the compute dtype
    auto g = grad.reshape({-1, out_features}).to(dtype);
    auto grad_x = matmul_nt(g, p.full.view({out_features, in_features}).t()).view(x.sizes()).to(x.scalar_type());
    if (--p.head_uses == 0 && sharded()) {
      note_held();
      release_param(i);
      units[static_cast<size_t>(root())].gathered = false;
    }
    if (p.frozen) return grad_x;  // a frozen head (LoRA) needs only x's gradient
    auto grad_w = matmul_nt(g.t(), x.reshape({-1, in_features}).to(dtype).t());  // (out, in), compute dtype
    note_held(grad_w.numel() * grad_w.element_size());
    if (sync) {
      p.head_reduced = true;
      start_reduce({i}, {take_accumulated(p, grad_w)});
    } else if (low_precision()) {
      accumulate(p, grad_w);
    } else if (p.param.grad().defined()) {
      p.param.mutable_grad().add_(grad_w);
    } else {
      p.param.mutable_grad() = grad_w;
    }
    return grad_x;
  }

  void settle() {
    for (auto& u : units) {
      if (u.gather_work) {
        u.gather_work->wait();
        u.gather_work.reset();
        u.gather_in.reset();
        u.gather_out.reset();
      }
      u.backward_pending = false;
    }
    for (auto& p : params) {
      p.head_uses = 0;
      p.head_reduced = false;
    }
    for (int ui = 0; ui <= root(); ++ui) free_unit(ui);
  }
};

namespace {

// Identity on an activation at a unit's edge; its backward tells the unit:
// - kInput (the activation entering the unit): it runs once the unit's backward is complete
//   (every node of the unit leads to the unit's input), so the unit's gradients are
//   accumulated and can be reduced;
// - !kInput (the activation leaving the unit): it runs before the unit's backward, so the unit
//   is gathered again (its all-gather was prefetched) and the one before starts gathering.
template <bool kInput>
struct UnitBoundary : torch::autograd::Function<UnitBoundary<kInput>> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                                                FsdpModule::Impl* impl, int64_t unit) {
    ctx->saved_data["impl"] = reinterpret_cast<int64_t>(impl);
    ctx->saved_data["unit"] = unit;
    return {x};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* impl = reinterpret_cast<FsdpModule::Impl*>(ctx->saved_data["impl"].toInt());
    const int unit = static_cast<int>(ctx->saved_data["unit"].toInt());
    if constexpr (kInput)
      impl->post_backward(unit);
    else
      impl->pre_backward(unit);
    return {grads[0], {}, {}};
  }
};
using UnitInputBoundary = UnitBoundary<true>;
using UnitOutputBoundary = UnitBoundary<false>;

using HeadForward = std::function<at::Tensor(const at::Tensor&)>;

// FsdpModule::head: `forward` (the model's own x @ weight^T) without autograd, and a backward
// that computes the weight's gradient in the engine (Impl::head_backward).
struct HeadFunction : torch::autograd::Function<HeadFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                                                FsdpModule::Impl* impl, int64_t param, const HeadForward* fn) {
    ctx->save_for_backward({x});
    ctx->saved_data["impl"] = reinterpret_cast<int64_t>(impl);
    ctx->saved_data["param"] = param;
    return {(*fn)(x)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* impl = reinterpret_cast<FsdpModule::Impl*>(ctx->saved_data["impl"].toInt());
    const auto param = static_cast<size_t>(ctx->saved_data["param"].toInt());
    const auto x = ctx->get_saved_variables()[0];
    return {impl->head_backward(param, grads[0], x), {}, {}, {}};
  }
};

}  // namespace

FsdpModule::FsdpModule(std::vector<FsdpUnit> units, DeviceMesh mesh, FsdpOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.mesh = std::move(mesh);
  m.options = options;
  m.strategy = strategy_of(m.mesh, options.reshard_after_forward);
  if (units.empty()) throw ValueError("FsdpModule: no units");
  torch::NoGradGuard no_grad;
  const int S = m.S(), r = m.mesh.shard_rank();
  for (auto& unit : units) {
    Unit u;
    u.name = unit.name;
    for (auto& np : unit.parameters) {
      Param p;
      p.name = np.name;
      p.param = np.tensor;
      p.frozen = !np.tensor.requires_grad();
      p.full_shape = np.tensor.sizes().vec();
      p.dtype = np.tensor.scalar_type();
      p.rows = np.tensor.dim() == 0 ? 1 : np.tensor.size(0);
      p.row_numel = p.rows == 0 ? 0 : np.tensor.numel() / p.rows;
      p.rows_per_shard = (p.rows + S - 1) / S;
      auto full = np.tensor.detach().reshape({p.rows, p.row_numel}).to(at::kFloat);
      auto shard = torch::zeros({p.rows_per_shard, p.row_numel}, full.options());
      const int64_t begin = std::min<int64_t>(r * p.rows_per_shard, p.rows);
      const int64_t end = std::min<int64_t>(begin + p.rows_per_shard, p.rows);
      if (end > begin) shard.narrow(0, 0, end - begin).copy_(full.narrow(0, begin, end - begin));
      p.shard = shard.reshape({-1});
      const auto compute = m.options.mixed_precision.param_dtype;
      if (S == 1 && compute == at::kFloat) {
        p.full = p.shard.view(p.full_shape);  // NO_SHARD in float32: parameter and master share storage
      } else {
        p.full = torch::empty(p.full_shape, np.tensor.options().dtype(compute));
        if (S == 1) {
          p.full.view({-1}).copy_(p.shard);
          p.cast_version = p.shard._version();
        }
      }
      np.tensor.set_data(p.full);
      p.live = S == 1;
      u.params.push_back(m.params.size());
      u.shard_numel += p.shard_numel();
      m.params.push_back(std::move(p));
    }
    m.units.push_back(std::move(u));
  }
  for (auto& u : m.units) {
    if (m.sharded()) {
      for (size_t i : u.params) release_storage(m.params[i].full);
    } else {
      u.gathered = true;
    }
  }
  if (!m.params.empty()) m.device = m.params.front().shard.device();
  m.peak = 0;
  m.offload();
}

FsdpModule::~FsdpModule() {
  try {
    impl_->settle();
    for (auto& r : impl_->reductions)
      if (r.work) r.work->wait();
  } catch (...) {
  }
}

ShardingStrategy FsdpModule::strategy() const {
  return impl_->strategy;
}
const FsdpOptions& FsdpModule::options() const {
  return impl_->options;
}
const DeviceMesh& FsdpModule::mesh() const {
  return impl_->mesh;
}
int FsdpModule::num_units() const {
  return static_cast<int>(impl_->units.size());
}
int FsdpModule::root_unit() const {
  return impl_->root();
}
const std::string& FsdpModule::unit_name(int unit) const {
  return impl_->units.at(static_cast<size_t>(unit)).name;
}

int FsdpModule::find_unit(const std::string& name) const {
  for (size_t i = 0; i < impl_->units.size(); ++i)
    if (impl_->units[i].name == name) return static_cast<int>(i);
  return -1;
}

void FsdpModule::begin_forward() {
  auto& m = *impl_;
  m.onload();
  for (auto& u : m.units) u.backward_pending = false;  // a forward whose backward never ran
  for (auto& p : m.params) p.head_uses = 0;
  if (!m.sharded() && m.options.mixed_precision.param_dtype != at::kFloat)
    for (auto& u : m.units) m.materialize_replicated(u);  // the casts follow the last step
  m.finish_gather(m.root());
  if (m.root() > 0) m.start_gather(0);
  if (torch::GradMode::is_enabled()) m.units[static_cast<size_t>(m.root())].backward_pending = true;
}

at::Tensor FsdpModule::enter_unit(int unit, const at::Tensor& x) {
  auto& m = *impl_;
  if (unit < 0 || unit >= m.root()) throw ValueError("FsdpModule::enter_unit: no layer unit " + std::to_string(unit));
  m.finish_gather(unit);
  if (unit + 1 < m.root()) m.start_gather(unit + 1);
  if (!torch::GradMode::is_enabled()) return x;
  m.units[static_cast<size_t>(unit)].backward_pending = true;
  if (!x.requires_grad()) return x;  // finish_backward reduces this unit
  return UnitInputBoundary::apply(x, impl_.get(), unit)[0];
}

at::Tensor FsdpModule::exit_unit(int unit, const at::Tensor& x) {
  auto& m = *impl_;
  if (!torch::GradMode::is_enabled()) {
    m.free_unit(unit);
    return x;
  }
  if (m.options.reshard_after_forward) m.free_unit(unit);
  return UnitOutputBoundary::apply(x, impl_.get(), unit)[0];
}

void FsdpModule::finish_backward() {
  auto& m = *impl_;
  m.note_held();
  for (int ui = m.root(); ui >= 0; --ui) m.post_backward(ui);
  for (auto& r : m.reductions) m.wait_reduce(r);
  m.reductions.clear();
  m.settle();
}

at::Tensor FsdpModule::head(const at::Tensor& x, const at::Tensor& weight,
                            const std::function<at::Tensor(const at::Tensor&)>& forward) {
  auto& m = *impl_;
  size_t index = m.params.size();
  for (size_t i : m.units[static_cast<size_t>(m.root())].params)
    if (m.params[i].param.unsafeGetTensorImpl() == weight.unsafeGetTensorImpl()) index = i;
  if (index == m.params.size())
    throw ValueError("FsdpModule::head: the weight (shape " + c10::str(weight.sizes()) +
                     ") is not a parameter of the root unit");
  if (weight.dim() != 2) throw ShapeError("FsdpModule::head: the weight of '" + m.params[index].name + "' is not 2-D");
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) return forward(x);
  ++m.params[index].head_uses;
  return HeadFunction::apply(x, impl_.get(), static_cast<int64_t>(index), &forward)[0];
}

void FsdpModule::end_forward() {
  impl_->settle();
  impl_->offload();
}

void FsdpModule::offload() {
  impl_->offload();
}
void FsdpModule::onload() {
  impl_->onload();
}
bool FsdpModule::offload_moves() const {
  return impl_->offload_moves();
}
bool FsdpModule::offloaded() const {
  return impl_->offloaded;
}

void FsdpModule::set_requires_gradient_sync(bool sync) {
  impl_->sync = sync;
}

void FsdpModule::for_each_full_parameter(const std::function<void(const std::string&, const at::Tensor&)>& use) {
  auto& m = *impl_;
  torch::NoGradGuard no_grad;
  m.settle();
  m.onload();
  if (!m.sharded())
    for (auto& u : m.units) m.materialize_replicated(u);
  m.start_gather(0);
  for (int ui = 0; ui <= m.root(); ++ui) {
    m.finish_gather(ui);
    if (ui < m.root()) m.start_gather(ui + 1);
    for (size_t i : m.units[static_cast<size_t>(ui)].params) use(m.params[i].name, m.params[i].full);
    m.free_unit(ui);
  }
}

void FsdpModule::unshard_all() {
  auto& m = *impl_;
  m.onload();
  if (!m.sharded()) {
    for (auto& u : m.units) m.materialize_replicated(u);
    return;
  }
  m.start_gather(0);
  for (int ui = 0; ui <= m.root(); ++ui) {
    m.finish_gather(ui);
    if (ui < m.root()) m.start_gather(ui + 1);
  }
}

void FsdpModule::reshard_all() {
  impl_->settle();
  impl_->offload();
}

std::vector<at::Tensor> FsdpModule::local_shards() const {
  std::vector<at::Tensor> out;
  for (const auto& p : impl_->params) out.push_back(p.shard);
  return out;
}

std::vector<FsdpModule::ShardInfo> FsdpModule::shard_infos() const {
  std::vector<ShardInfo> out;
  for (const auto& p : impl_->params)
    out.push_back({p.name, p.full_shape, p.rows, p.rows_per_shard, p.dtype, /*trainable=*/!p.frozen});
  return out;
}

void FsdpModule::load_full_parameters(const std::vector<NamedParameter>& full, const std::string& source) {
  auto& m = *impl_;
  torch::NoGradGuard no_grad;
  m.settle();
  m.onload();
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& np : full) by_name[np.name] = &np.tensor;
  const int64_t r = m.mesh.shard_rank();
  for (auto& p : m.params) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) throw KeyError(source + ": no tensor '" + p.name + "'");
    const auto& t = *it->second;
    if (t.sizes().vec() != p.full_shape)
      throw ShapeError(source + ": tensor '" + p.name + "' has shape " + c10::str(t.sizes()) + ", the model has " +
                       c10::str(c10::IntArrayRef(p.full_shape)));
    auto rows = t.reshape({p.rows, p.row_numel}).to(p.shard.device(), at::kFloat);
    auto shard = p.shard.view({p.rows_per_shard, p.row_numel});
    shard.zero_();
    const int64_t begin = std::min<int64_t>(r * p.rows_per_shard, p.rows);
    const int64_t end = std::min<int64_t>(begin + p.rows_per_shard, p.rows);
    if (end > begin) shard.narrow(0, 0, end - begin).copy_(rows.narrow(0, begin, end - begin));
  }
  if (!m.sharded())
    for (auto& u : m.units) m.materialize_replicated(u);
  m.offload();
}

void FsdpModule::load_local_rows(const std::function<void(const std::vector<at::Tensor>& rows)>& fill) {
  auto& m = *impl_;
  torch::NoGradGuard no_grad;
  m.settle();
  m.onload();
  const int64_t r = m.mesh.shard_rank();
  std::vector<at::Tensor> rows, targets;  // rows in host memory (staged for device shards)
  for (auto& p : m.params) {
    auto shard = p.shard.view({p.rows_per_shard, p.row_numel});
    shard.zero_();
    const int64_t begin = std::min<int64_t>(r * p.rows_per_shard, p.rows);
    const int64_t end = std::min<int64_t>(begin + p.rows_per_shard, p.rows);
    targets.push_back(shard.narrow(0, 0, end - begin));
    rows.push_back(shard.is_cpu() ? targets.back() : torch::empty({end - begin, p.row_numel}, torch::kFloat));
  }
  fill(rows);
  for (size_t i = 0; i < rows.size(); ++i)
    if (!targets[i].is_same(rows[i])) targets[i].copy_(rows[i]);
  if (!m.sharded())
    for (auto& u : m.units) m.materialize_replicated(u);
  m.offload();
}

int64_t FsdpModule::sharded_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : impl_->params) {
    bytes += p.shard.numel() * 4;
    if (p.shard.grad().defined()) bytes += p.shard.grad().numel() * 4;
  }
  return bytes;
}

int64_t FsdpModule::materialized_bytes() const {
  int64_t bytes = impl_->materialized;
  for (const auto& p : impl_->params) {
    if (p.param.grad().defined()) bytes += p.param.grad().numel() * p.param.grad().element_size();
    if (p.accum.defined()) bytes += p.accum.numel() * 4;
  }
  return bytes;
}

int64_t FsdpModule::held_bytes() const {
  return sharded_bytes() + materialized_bytes();
}

int64_t FsdpModule::peak_materialized_bytes() const {
  return impl_->peak;
}
int64_t FsdpModule::peak_held_bytes() const {
  return std::max(impl_->held_peak, held_bytes());
}
void FsdpModule::reset_peak() {
  impl_->peak = impl_->materialized;
  impl_->held_peak = held_bytes();
}

}  // namespace hyflow::parallel
