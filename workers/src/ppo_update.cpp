#include "ppo_update.hpp"

#include "worker_common.hpp"

#include "fsdp_model.hpp"

#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/config.hpp>
#include <hyflow/models/lora.hpp>
#include <hyflow/models/safetensors.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/parallel/fsdp_checkpoint.hpp>
#include <hyflow/parallel/process_group.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>
#include <hyflow/workers/micro_batches.hpp>

#include <torch/torch.h>

#include <map>

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

namespace {

namespace fs = std::filesystem;

// The role's parameters by name in model order (the optimizer of a replicated role holds them in
// this order).
std::vector<std::pair<std::string, at::Tensor>> named_parameters_of(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void load_sharded_optimizer_state(const RoleCheckpoint& role, const fs::path& dir) {
  if (role.fsdp) {  // this rank's rows only
    auto* sharded = dynamic_cast<parallel::ShardedOptimizer*>(role.optimizer);
    if (!sharded) throw Error(role.worker + ": a sharded model without a sharded optimizer");
    parallel::load_sharded_optimizer(*sharded, *role.fsdp, dir);
    return;
  }
  auto full = parallel::load_sharded_optimizer(dir);
  const std::string source = "optimizer state of '" + dir.string() + "'";
  // a replicated model (one rank, or fsdp_size 1): the full state in the model's parameter order
  auto* replicated = dynamic_cast<parallel::DataParallelOptimizer*>(role.optimizer);
  if (!replicated) throw Error(role.worker + ": a replicated model without a data-parallel optimizer");
  std::map<std::string, parallel::AdamState*> by_name;
  for (auto& p : full.parameters) by_name[p.name] = &p.state;
  std::vector<parallel::AdamState> state;
  for (const auto& [name, tensor] : named_parameters_of(*role.model)) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw KeyError(source + ": no optimizer state for parameter '" + name + "'");
    auto s = *it->second;
    if (s.exp_avg.defined()) {
      s.exp_avg = s.exp_avg.view(tensor.sizes());
      s.exp_avg_sq = s.exp_avg_sq.view(tensor.sizes());
    }
    state.push_back(std::move(s));
  }
  replicated->set_adam_state(state, full.scheduler_steps, source);
}

// A replicated checkpoint (one rank, or fsdp_size 1, in fp32: each rank's optim_world_size_W_rank_r.pt, the
// moments shaped like the parameters) into the sharded engine, which a mixed-precision config gives at the
// same world size: the file is read by a data-parallel optimizer over the trainable parameters' full shapes
// in model order (the replicated one's parameters), and this rank's rows go to the sharded optimizer.
void load_replicated_optimizer_state(const RoleCheckpoint& role, const fs::path& dir) {
  auto* sharded = dynamic_cast<parallel::ShardedOptimizer*>(role.optimizer);
  if (!sharded) throw Error(role.worker + ": a sharded model without a sharded optimizer");
  std::map<std::string, parallel::FsdpModule::ShardInfo> infos;
  for (auto& info : role.fsdp->shard_infos()) infos.emplace(info.name, std::move(info));
  std::vector<std::string> names;
  std::vector<at::Tensor> full;
  for (const auto& [name, tensor] : named_parameters_of(*role.model)) {
    const auto& info = infos.at(name);
    if (!info.trainable) continue;
    names.push_back(name);
    full.push_back(torch::zeros(info.full_shape, torch::kFloat));
  }
  const auto file = optimizer_file(dir, role.rank, role.world_size);
  parallel::DataParallelOptimizer replicated(full, parallel::OptimConfig{}, nullptr, "optimizer state of '" +
                                                                                         file.string() + "'");
  replicated.load(file);
  const auto state = replicated.adam_state();
  std::vector<parallel::NamedAdamState> named;
  for (size_t i = 0; i < names.size(); ++i) named.push_back({names[i], state[i]});
  sharded->load_full_state(named, replicated.scheduler_steps(), "optimizer state of '" + file.string() + "'");
}

// The float32 masters of the engine's trainable parameters (LoRA's adapters, the critic's score head), full, by
// name: each gathered over the shard group (a collective: every rank calls it), padding rows dropped. Under
// mixed precision the model's gathered parameters are the compute copies; the PEFT folder holds these.
std::map<std::string, at::Tensor> trainable_masters(const parallel::FsdpModule& fsdp) {
  const auto infos = fsdp.shard_infos();
  const auto shards = fsdp.local_shards();
  const auto& group = fsdp.mesh().shard;
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < infos.size(); ++i) {
    const auto& info = infos[i];
    if (!info.trainable) continue;
    const auto shard = shards[i].detach().to(torch::kCPU);
    const auto rows = group ? torch::cat(group->all_gather(shard)) : shard;
    out.emplace(info.name, rows.view({-1, shard.numel() / info.rows_per_shard}).narrow(0, 0, info.rows)
                               .reshape(info.full_shape)
                               .clone());
  }
  return out;
}

}  // namespace

const char* const kLoraAdapterDir = "lora_adapter";

void save_role_checkpoint(const RoleCheckpoint& role, const fs::path& dir, int64_t global_step) {
  const auto& contents = *role.contents;
  fs::create_directories(dir);
  const bool sharded = role.fsdp != nullptr;
  const bool model = role.model && contents.saves("model");
  const bool optimizer = role.optimizer && contents.saves("optimizer");
  const bool hf = role.model && (contents.saves("hf_model") || (!sharded && model));
  if (sharded && (model || optimizer)) {
    // the optimizer's rows are described by the parameter manifest: the shards come along
    const auto* sharded_optimizer =
        optimizer ? dynamic_cast<const parallel::ShardedOptimizer*>(role.optimizer) : nullptr;
    if (optimizer && !sharded_optimizer) throw Error(role.worker + ": a sharded model without a sharded optimizer");
    parallel::save_sharded_checkpoint(*role.fsdp, sharded_optimizer, dir,
                                      Json{{"config", models::config_to_json(*role.config)}}, role.group);
  }
  if (role.lora) {
    if (model || hf) {  // the adapters, gathered when sharded (the sharded layout above resumes too)
      if (sharded) role.fsdp->unshard_all();
      if (role.rank == 0)
        models::save_adapter(*role.model, *role.lora, role.model_dir.string(), dir / kLoraAdapterDir,
                             role.modules_to_save, role.task_type);
      if (sharded) role.fsdp->reshard_all();
      // under mixed precision those were the compute copies: the file gets the float32 masters instead
      if (sharded && role.fsdp->options().mixed_precision.param_dtype != at::kFloat) {
        const auto masters = trainable_masters(*role.fsdp);
        if (role.rank == 0) {
          const auto file = dir / kLoraAdapterDir / models::kAdapterWeightsFile;
          const std::string peft_prefix = "base_model.model.";  // adapter_state's names: PEFT's prefix + ours
          models::NamedTensors tensors;
          for (const auto& [peft_name, compute] : models::adapter_state(*role.model, role.modules_to_save))
            tensors.emplace_back(peft_name, masters.at(peft_name.substr(peft_prefix.size())));
          models::write_safetensors(file, tensors, Json{{"format", "pt"}});
        }
      }
    }
  } else if (hf) {
    if (sharded) role.fsdp->unshard_all();  // rank 0 writes the full model
    if (role.rank == 0) models::save_pretrained(*role.model, *role.config, dir);
    if (sharded) role.fsdp->reshard_all();
  }
  if (role.rank == 0) {
    if (role.model && (model || hf || optimizer)) copy_tokenizer_files(role.model_dir, dir);
    write_state(dir, role.worker, role.world_size, global_step, sharded && (model || optimizer));
  }
  if (optimizer && !sharded) role.optimizer->save(optimizer_file(dir, role.rank, role.world_size));
  if (contents.saves("extra")) parallel::save_rng_state(rng_file(dir, role.rank, role.world_size), role.generator);
  if (role.group) role.group->barrier();
}

void load_role_checkpoint(const RoleCheckpoint& role, const fs::path& dir) {
  const auto& contents = *role.contents;
  const bool sharded_layout = parallel::is_sharded_checkpoint(dir);
  const int saved_world_size = check_state(dir, role.worker, role.world_size, /*any_world_size=*/sharded_layout);
  const bool same_world = saved_world_size == role.world_size;
  if (role.model && contents.loads("model") && role.lora && !(sharded_layout && role.fsdp)) {
    // the PEFT folder: checked against the model, onto the base of model_dir
    if (role.fsdp) {
      auto adapter = models::read_adapter(*role.model, dir / kLoraAdapterDir, role.model_dir.string());
      auto full = models::load_checkpoint_tensors(role.model_dir);
      full.insert(full.end(), adapter.begin(), adapter.end());  // later names win: the adapter's score head
      role.fsdp->load_full_parameters(named_parameters(full), dir.string());
    } else {
      models::load_adapter(*role.model, dir / kLoraAdapterDir, role.model_dir.string());
    }
  } else if (role.model && contents.loads("model")) {
    torch::NoGradGuard no_grad;
    if (sharded_layout && role.fsdp) {
      parallel::load_sharded_parameters(*role.fsdp, dir);  // this rank's rows only
    } else {
      std::vector<parallel::NamedParameter> full;
      models::NamedTensors tensors;
      if (sharded_layout) {
        full = parallel::load_sharded_parameters(dir);
        for (const auto& p : full) tensors.emplace_back(p.name, p.tensor);
      } else {
        tensors = models::load_checkpoint_tensors(dir);
        full = named_parameters(tensors);
      }
      if (role.fsdp)
        role.fsdp->load_full_parameters(full, dir.string());
      else
        models::load_parameters(*role.model, tensors, dir.string());
    }
  }
  if (role.optimizer && contents.loads("optimizer")) {
    if (sharded_layout)
      load_sharded_optimizer_state(role, dir);
    else if (role.fsdp)  // saved replicated (fp32), resumed sharded (e.g. under mixed precision)
      load_replicated_optimizer_state(role, dir);
    else
      role.optimizer->load(optimizer_file(dir, role.rank, role.world_size));
  }
  // RNG streams are per rank: restored at the saved world size only (docs/workers.md)
  if (contents.loads("extra") && same_world)
    parallel::load_rng_state(rng_file(dir, role.rank, role.world_size), role.generator);
}

}  // namespace hyflow::workers::detail
