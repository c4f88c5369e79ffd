#include "ppo_update.hpp"

#include "worker_common.hpp"

#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/parallel/process_group.hpp>
#include <hyflow/workers/micro_batches.hpp>

namespace hyflow::workers::detail {

void MetricLists::add(const std::string& name, double value) {
  auto it = index_.find(name);
  if (it == index_.end()) {
    it = index_.emplace(name, lists_.size()).first;
    lists_.push_back({name, {}});
  }
  lists_[it->second].second.push_back(value);
}

void ppo_update(const std::vector<DataProto>& mini_batches, const PpoUpdatePlan& plan, parallel::Optimizer& optimizer,
                const std::string& method, MetricLists& metrics,
                const std::function<void(const DataProto& micro_batch, double scale)>& micro_step) {
  for (int64_t epoch = 0; epoch < plan.ppo_epochs; ++epoch) {
    for (const auto& mini : mini_batches) {
      const auto micro = make_micro_batches(mini, plan.micro_batching, method, plan.fsdp ? plan.group : nullptr);
      optimizer.zero_grad();
      for (size_t m = 0; m < micro.batches.size(); ++m) {
        const auto& mb = micro.batches[m];
        const double scale = plan.micro_batching.use_dynamic_bsz
                                 ? static_cast<double>(mb.size()) / static_cast<double>(mini.size())
                                 : 1.0 / static_cast<double>(micro.batches.size());
        if (plan.fsdp) plan.fsdp->set_requires_gradient_sync(m + 1 == micro.batches.size());
        micro_step(mb, scale);
        if (plan.fsdp) plan.fsdp->finish_backward();
      }
      metrics.add(plan.prefix + "/grad_norm", optimizer.step(plan.grad_clip));
    }
  }
  optimizer.zero_grad();
  metrics.add(plan.prefix + "/lr", optimizer.lr());  // verl logs the lr this call used, then steps
  optimizer.scheduler_step();
}

void save_train_state(const std::filesystem::path& dir, const std::string& worker, int rank, int world_size,
                      int64_t global_step, const std::function<void(const std::filesystem::path&)>& save_model,
                      const parallel::Optimizer* optimizer, const at::Generator* generator,
                      parallel::ProcessGroup* group) {
  std::filesystem::create_directories(dir);
  if (rank == 0) {
    if (save_model) save_model(dir);
    write_state(dir, worker, world_size, global_step);
  }
  if (optimizer) optimizer->save(optimizer_file(dir, rank, world_size));
  parallel::save_rng_state(rng_file(dir, rank, world_size), generator);
  if (group) group->barrier();
}

void load_train_state(const std::filesystem::path& dir, const std::string& worker, int rank, int world_size,
                      const std::function<void(const std::filesystem::path&)>& load_model,
                      parallel::Optimizer* optimizer, at::Generator* generator) {
  check_state(dir, worker, world_size);
  if (load_model) load_model(dir);
  if (optimizer) optimizer->load(optimizer_file(dir, rank, world_size));
  parallel::load_rng_state(rng_file(dir, rank, world_size), generator);
}

}  // namespace hyflow::workers::detail
