#include <hyflow/workers/reward_model_worker.hpp>

#include "worker_common.hpp"

#include <hyflow/dataproto/position_ids.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/workers/micro_batches.hpp>

#include <torch/torch.h>

namespace hyflow::workers {

namespace {
const Json& config_arg(const Json& args) {
  if (!args.is_object()) throw ValueError("RewardModelWorker: init args must be an object, got " + args.dump());
  for (auto it = args.begin(); it != args.end(); ++it)
    if (it.key() != "config")
      throw KeyError("RewardModelWorker: unknown init arg '" + it.key() + "' (expected config)");
  if (!args.contains("config")) throw KeyError("RewardModelWorker: init args lack 'config'");
  return args.at("config");
}
}  // namespace

RewardModelWorker::RewardModelWorker(const Json& args)
    : config_(parse_reward_model_config(config_arg(args))), device_(detail::resolve_device(device())) {}

void RewardModelWorker::init_model() {
  model_ = models::load_value_model(config_.model.path);
  model_->to(device_);
  model_->eval();
  group_ = detail::process_group_of(
      *this, {std::chrono::seconds(config_.nccl_timeout), "actor_rollout_ref.nccl_timeout (the reward model's)"});
  parallel::broadcast_parameters(model_->parameters(), group_.get());  // a fresh score head differs per rank
  for (auto& p : model_->parameters()) p.set_requires_grad(false);
}

DataProto RewardModelWorker::compute_rm_score(DataProto data) {
  static const std::string method = "compute_rm_score";
  if (!model_) throw ValueError("compute_rm_score: call init_model first");
  detail::require_keys(data, {"input_ids", "attention_mask", "responses"}, method);
  torch::NoGradGuard no_grad;
  auto micro = make_micro_batches(
      detail::on_device(data, {"input_ids", "attention_mask", "position_ids", "responses"}, device_), config_.forward,
      method);
  std::vector<at::Tensor> parts;
  for (const auto& mb : micro.batches) {
    const auto& mask = mb.batch.at("attention_mask");
    auto positions =
        mb.batch.contains("position_ids") ? mb.batch.at("position_ids") : dataproto::position_ids_from_mask(mask);
    auto scores = model_(mb.batch.at("input_ids"), mask, positions);  // (B, T)
    // verl: the last valid token is argmax(position_ids * attention_mask); the score goes
    // there, then the response part is kept.
    auto last = (positions * mask).argmax(-1);  // (B,)
    auto rows = torch::arange(scores.size(0), last.options());
    auto token_scores = torch::zeros_like(scores);
    token_scores.index_put_({rows, last}, scores.index({rows, last}));
    const int64_t R = mb.batch.at("responses").size(1);
    parts.push_back(token_scores.narrow(1, scores.size(1) - R, R).to(torch::kFloat32).cpu());
  }
  return restore_order(DataProto(TensorDict{{"rm_scores", torch::cat(parts)}}), micro.order);
}

void RewardModelWorker::define_methods(MethodTable<RewardModelWorker>& t) {
  t.add("init_model", &RewardModelWorker::init_model, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("compute_rm_score", &RewardModelWorker::compute_rm_score, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
}

}  // namespace hyflow::workers
