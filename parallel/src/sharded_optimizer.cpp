#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace hyflow::parallel {

// The local optimizer is the replicated one on the shards without a group: AdamW and the lr
// schedule are the same code, the reduction and the clipping happen here.
ShardedOptimizer::ShardedOptimizer(std::shared_ptr<FsdpModule> module, const OptimConfig& config,
                                   const std::string& path)
    : module_(std::move(module)),
      local_(std::make_unique<DataParallelOptimizer>(module_->local_shards(), config, nullptr, path)) {}

ShardedOptimizer::~ShardedOptimizer() = default;

std::vector<at::Tensor> ShardedOptimizer::state_tensors() const {
  return local_->state_tensors();
}

void ShardedOptimizer::zero_grad() {
  local_->zero_grad();
}

double ShardedOptimizer::step(double max_norm) {
  torch::NoGradGuard no_grad;
  auto shards = module_->local_shards();
  double local = 0.0;
  for (auto& s : shards) {
    if (!s.grad().defined()) s.mutable_grad() = torch::zeros_like(s);
    local += s.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  auto total = torch::tensor({local}, torch::kDouble);
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

}  // namespace hyflow::parallel
