#include <hyflow/workers/critic_worker.hpp>

#include "fsdp_model.hpp"
#include "ppo_update.hpp"
#include "worker_common.hpp"

#include <hyflow/algos/core_algos.hpp>
#include <hyflow/dataproto/position_ids.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/process_group.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>
#include <hyflow/workers/micro_batches.hpp>

#include <torch/torch.h>

namespace hyflow::workers {

namespace fs = std::filesystem;

namespace {
const Json& config_arg(const Json& args, const char* worker) {
  if (!args.is_object()) throw ValueError(std::string(worker) + ": init args must be an object, got " + args.dump());
  for (auto it = args.begin(); it != args.end(); ++it)
    if (it.key() != "config")
      throw KeyError(std::string(worker) + ": unknown init arg '" + it.key() + "' (expected config)");
  if (!args.contains("config")) throw KeyError(std::string(worker) + ": init args lack 'config'");
  return args.at("config");
}

const std::vector<std::string> kForwardKeys = {"input_ids", "attention_mask", "position_ids", "responses",
                                               "response_mask"};
}  // namespace

CriticWorker::CriticWorker(const Json& args)
    : config_(parse_critic_config(config_arg(args, "CriticWorker"))), device_(detail::resolve_device(device())) {
  mini_batch_rows_ = normalized_mini_batch_size(
      config_.ppo_mini_batch_size, config_.rollout_n, world_size(),
      config_.use_dynamic_bsz ? std::nullopt : config_.ppo_micro_batch_size_per_gpu, "critic.ppo_mini_batch_size");
}

CriticWorker::~CriticWorker() = default;

void CriticWorker::init_model() {
  model_ = models::load_value_model(config_.model.path);
  model_->to(device_);
  model_->model->set_gradient_checkpointing(config_.model.enable_gradient_checkpointing);
  const auto& lora = config_.model.lora;
  if (lora.enabled()) {  // the value head trains in full (PEFT's modules_to_save)
    models::apply_lora(*model_, lora, {"score"}, models::kLoraInitSeed);
    if (!config_.model.lora_adapter_path.empty())
      models::load_adapter(*model_, config_.model.lora_adapter_path, config_.model.path);
  }
  group_ = detail::process_group_of(*this, {std::chrono::seconds(config_.nccl_timeout), "critic.nccl_timeout"});
  parallel::broadcast_parameters(model_->parameters(), group_.get());  // a fresh value head differs per rank
  fsdp_ = detail::shard_model(*model_, group_, config_.fsdp, "critic", "critic.model.fsdp_config");
  if (fsdp_)
    optimizer_ = std::make_unique<parallel::ShardedOptimizer>(fsdp_, config_.optim, "critic.optim");
  else
    optimizer_ =
        std::make_unique<parallel::DataParallelOptimizer>(models::trainable_parameters(*model_), config_.optim,
                                                          group_, "critic.optim");
}

void CriticWorker::require_initialized(const char* method) const {
  if (!model_) throw ValueError(std::string(method) + ": call init_model first");
}

at::Tensor CriticWorker::response_values(const DataProto& mb) {
  const auto& mask = mb.batch.at("attention_mask");
  auto positions =
      mb.batch.contains("position_ids") ? mb.batch.at("position_ids") : dataproto::position_ids_from_mask(mask);
  auto values = detail::value_forward(model_, fsdp_.get(), mb.batch.at("input_ids"), mask, positions);  // (B, T)
  const int64_t R = mb.batch.at("responses").size(1), T = values.size(1);
  return values.narrow(1, T - R - 1, R);  // position t values the state before token t + 1
}

DataProto CriticWorker::compute_values(DataProto data) {
  static const std::string method = "compute_values";
  require_initialized("compute_values");
  detail::require_keys(data, {"input_ids", "attention_mask", "responses"}, method);
  torch::NoGradGuard no_grad;
  model_->eval();
  auto micro = make_micro_batches(detail::on_device(data, kForwardKeys, device_), config_.forward, method,
                                  fsdp_ ? group_.get() : nullptr);
  std::vector<at::Tensor> parts;
  for (const auto& mb : micro.batches) {
    auto values = response_values(mb);
    const int64_t R = values.size(1);
    auto mask = mb.batch.contains("response_mask")
                    ? mb.batch.at("response_mask")
                    : mb.batch.at("attention_mask").narrow(1, mb.batch.at("attention_mask").size(1) - R, R);
    parts.push_back((values * mask).cpu());
  }
  return restore_order(DataProto(TensorDict{{"values", torch::cat(parts)}}), micro.order);
}

DataProto CriticWorker::update_critic(DataProto data) {
  static const std::string method = "update_critic";
  require_initialized("update_critic");
  std::vector<std::string> keys = {"input_ids", "attention_mask", "responses", "response_mask", "values", "returns"};
  detail::require_keys(data, keys, method);
  keys.push_back("position_ids");
  const DataProto batch = detail::on_device(data, keys, device_);
  const ForwardBatching micro_batching{.micro_batch_size_per_gpu = config_.ppo_micro_batch_size_per_gpu,
                                       .use_dynamic_bsz = config_.use_dynamic_bsz,
                                       .max_token_len_per_gpu = config_.ppo_max_token_len_per_gpu};
  detail::MetricLists metrics;
  model_->train();
  const detail::PpoUpdatePlan plan{.ppo_epochs = config_.ppo_epochs,
                                   .micro_batching = micro_batching,
                                   .grad_clip = config_.grad_clip,
                                   .prefix = "critic",
                                   .fsdp = fsdp_.get(),
                                   .group = group_.get()};
  detail::ppo_update(
      batch.split(mini_batch_rows_), plan, *optimizer_, method, metrics, [&](const DataProto& mb, double scale) {
        auto vpreds = response_values(mb);
        const auto& mask = mb.batch.at("response_mask");
        auto vf = algos::core_algos::compute_value_loss(vpreds, mb.batch.at("returns"), mb.batch.at("values"), mask,
                                                        config_.cliprange_value, config_.loss_agg_mode);
        (vf.vf_loss * scale).backward();
        metrics.add("critic/vf_loss", vf.vf_loss.item<double>() * scale);
        metrics.add("critic/vf_clipfrac", vf.vf_clipfrac.item<double>());
        metrics.add("critic/vpred_mean", algos::core_algos::masked_mean(vpreds.detach(), mask).item<double>());
      });
  DataProto out;
  out.meta_info = Json{{"metrics", detail::metrics_json(metrics.lists())}};
  return out;
}

detail::RoleCheckpoint CriticWorker::checkpoint_role() {
  return {.worker = "CriticWorker",
          .rank = rank(),
          .world_size = world_size(),
          .model = model_.get(),
          .config = &model_->config(),
          .fsdp = fsdp_.get(),
          .optimizer = optimizer_.get(),
          .generator = nullptr,
          .group = group_.get(),
          .model_dir = config_.model.path,
          .contents = &config_.checkpoint,
          .lora = config_.model.lora.enabled() ? &config_.model.lora : nullptr,
          .modules_to_save = {"score"},
          .task_type = "TOKEN_CLS"};
}

void CriticWorker::save_checkpoint(std::string dir, int64_t global_step) {
  require_initialized("save_checkpoint");
  detail::save_role_checkpoint(checkpoint_role(), dir, global_step);
}

void CriticWorker::load_checkpoint(std::string dir) {
  require_initialized("load_checkpoint");
  detail::load_role_checkpoint(checkpoint_role(), dir);
}

std::string CriticWorker::parameter_digest() const {
  if (!model_) throw ValueError("parameter_digest: call init_model first");
  return detail::sharded_parameter_digest(*model_, fsdp_.get());
}

void CriticWorker::define_methods(MethodTable<CriticWorker>& t) {
  t.add("init_model", &CriticWorker::init_model, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("compute_values", &CriticWorker::compute_values, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
  t.add("update_critic", &CriticWorker::update_critic, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
  t.add("parameter_digest", &CriticWorker::parameter_digest, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("save_checkpoint", &CriticWorker::save_checkpoint, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("load_checkpoint", &CriticWorker::load_checkpoint, {.dispatch = Dispatch::ONE_TO_ALL});
}

}  // namespace hyflow::workers
