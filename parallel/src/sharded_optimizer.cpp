#include <hyflow/core/error.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>

namespace hyflow::parallel {

// The local optimizer is the replicated one on the shards without a group: AdamW and the lr
// schedule are the same code, the reduction and the clipping happen here.
ShardedOptimizer::ShardedOptimizer(std::shared_ptr<FsdpModule> module, const OptimConfig& config,
                                   const std::string& path)
    : module_(std::move(module)) {
  for (const auto& info : module_->shard_infos()) trainable_.push_back(info.trainable);
  local_ = std::make_unique<DataParallelOptimizer>(trainable_shards(), config, nullptr, path);
}

std::vector<at::Tensor> ShardedOptimizer::trainable_shards() const {
  const auto all = module_->local_shards();
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < all.size(); ++i)
    if (trainable_[i]) out.push_back(all[i]);
  return out;
}

ShardedOptimizer::~ShardedOptimizer() = default;

std::vector<at::Tensor> ShardedOptimizer::state_tensors() const {
  return local_->state_tensors();
}

void ShardedOptimizer::zero_grad() {
  local_->zero_grad();
}

double ShardedOptimizer::step(double max_norm) {
  module_->onload();
  move_state(false);
  const double norm = step_on_device(max_norm);
  move_state(true);
  module_->offload();
  return norm;
}

void ShardedOptimizer::move_state(bool to_host) {
  const auto& options = module_->options();
  if (!options.optimizer_offload) return;
  auto state = local_->state_tensors();
  const auto shards = trainable_shards();
  if (shards.empty()) return;
  const auto device = shards.front().device();  // onloaded before a step
  if (!device.is_cuda() && !options.offload_cpu_copies) {
    note_offload_noop("fsdp_config.optimizer_offload");
    return;
  }
  torch::NoGradGuard no_grad;
  if (to_host) {
    for (auto& t : state) t.set_data(to_host_memory(t));
    state_offloaded_ = true;
    return;
  }
  for (auto& t : state)  // offloaded moments, or moments loaded into host memory
    if (state_offloaded_ || t.device() != device) t.set_data(from_host_memory(t, device));
  state_offloaded_ = false;
}

double ShardedOptimizer::step_on_device(double max_norm) {
  torch::NoGradGuard no_grad;
  auto shards = trainable_shards();
  // The squared norm stays on the shards' device (one host read, after the all-reduce: NCCL
  // reduces device tensors), summed in float64 in parameter order.
  at::Tensor total;
  for (auto& s : shards) {
    if (!s.grad().defined()) s.mutable_grad() = torch::zeros_like(s);
    auto sq = s.grad().to(at::kDouble).pow(2).sum().reshape({1});
    total = total.defined() ? total.add_(sq) : sq;
  }
  if (!total.defined()) total = torch::zeros({1}, torch::kDouble);
  if (module_->mesh().shard) module_->mesh().shard->all_reduce(total);
  const double norm = std::sqrt(total.item<double>());
  if (!std::isfinite(norm)) {
    zero_grad();
    return norm;
  }
  const double clip = max_norm / (norm + 1e-6);
  if (clip < 1.0)
    for (auto& s : shards) s.mutable_grad().mul_(clip);
  local_->step(std::numeric_limits<double>::infinity());  // clipping done with the global norm
  return norm;
}

double ShardedOptimizer::lr() const {
  return local_->lr();
}
void ShardedOptimizer::scheduler_step() {
  local_->scheduler_step();
}
int64_t ShardedOptimizer::scheduler_steps() const {
  return local_->scheduler_steps();
}
void ShardedOptimizer::save(const std::filesystem::path& file) const {
  local_->save(file);
}
void ShardedOptimizer::load(const std::filesystem::path& file) {
  local_->load(file);
}

std::vector<AdamState> ShardedOptimizer::shard_state() const {
  const auto local = local_->adam_state();  // the trainable shards' state
  std::vector<AdamState> out(trainable_.size());
  size_t k = 0;
  for (size_t i = 0; i < trainable_.size(); ++i)
    if (trainable_[i]) out[i] = local[k++];
  return out;
}

void ShardedOptimizer::load_full_state(const std::vector<NamedAdamState>& full, int64_t scheduler_steps,
                                       const std::string& source) {
  std::map<std::string, const AdamState*> by_name;
  for (const auto& n : full) by_name[n.name] = &n.state;
  const auto infos = module_->shard_infos();
  const auto shards = module_->local_shards();
  const int64_t r = module_->mesh().shard_rank();
  std::vector<AdamState> mine;
  mine.reserve(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    const auto& info = infos[i];
    auto it = by_name.find(info.name);
    if (it == by_name.end()) throw KeyError(source + ": no optimizer state for parameter '" + info.name + "'");
    const AdamState& s = *it->second;
    if (!s.exp_avg.defined()) {
      mine.push_back({});
      continue;
    }
    const int64_t row_numel = info.rows == 0 ? 0 : shards[i].numel() / info.rows_per_shard;
    const int64_t begin = std::min(r * info.rows_per_shard, info.rows);
    const int64_t end = std::min(begin + info.rows_per_shard, info.rows);
    auto slice = [&](const at::Tensor& t, const char* what) {
      if (!s.exp_avg_sq.defined() || t.numel() != info.rows * row_numel)
        throw ShapeError(source + ": " + what + " of parameter '" + info.name + "' has " + std::to_string(t.numel()) +
                         " values, the parameter " + std::to_string(info.rows * row_numel));
      auto out = torch::zeros({info.rows_per_shard, row_numel}, torch::kFloat);
      if (end > begin)
        out.narrow(0, 0, end - begin).copy_(t.reshape({info.rows, row_numel}).narrow(0, begin, end - begin));
      return out.reshape({-1});
    };
    mine.push_back({slice(s.exp_avg, "exp_avg"), slice(s.exp_avg_sq, "exp_avg_sq"), s.step});
  }
  load_shard_state(mine, scheduler_steps, source);
}

void ShardedOptimizer::load_shard_state(const std::vector<AdamState>& mine, int64_t scheduler_steps,
                                        const std::string& source) {
  if (mine.size() != trainable_.size())
    throw ShapeError(source + ": state for " + std::to_string(mine.size()) + " parameters, the module has " +
                     std::to_string(trainable_.size()));
  std::vector<AdamState> local;
  for (size_t i = 0; i < mine.size(); ++i)
    if (trainable_[i]) local.push_back(mine[i]);
  local_->set_adam_state(local, scheduler_steps, source);
}

}  // namespace hyflow::parallel
