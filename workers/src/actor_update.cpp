// ActorRolloutRefWorker::update_actor: verl's dp_actor.update_policy on the shared PPO update
// loop (ppo_update.hpp).
#include <hyflow/workers/actor_rollout_ref_worker.hpp>

#include "fsdp_model.hpp"
#include "ppo_update.hpp"
#include "worker_common.hpp"

#include <hyflow/algos/core_algos.hpp>
#include <hyflow/models/response_scores.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/workers/micro_batches.hpp>

#include <torch/torch.h>

namespace hyflow::workers {

DataProto ActorRolloutRefWorker::update_actor(DataProto data) {
  static const std::string method = "update_actor";
  if (!has_actor(role_)) throw ValueError(method + " needs the actor role; this worker is " + to_string(role_));
  require_initialized("update_actor");
  const auto& a = config_.actor;
  const double temperature = detail::meta_double(data, "temperature", config_.rollout.temperature, method);

  std::vector<std::string> keys = {"responses", "input_ids", "attention_mask", "response_mask", "advantages"};
  if (a.use_kl_loss) keys.push_back("ref_log_prob");
  detail::require_keys(data, keys, method);
  for (const char* optional : {"position_ids", "old_log_probs", "rollout_is_weights"})
    if (data.batch.contains(optional)) keys.push_back(optional);
  const DataProto batch = detail::on_device(data, keys, device_);

  const auto mini_batches = batch.split(mini_batch_rows_);
  // verl's on-policy shortcut: one mini-batch, one epoch -> the old policy is the current one
  const bool on_policy = mini_batches.size() == 1 && a.ppo_epochs == 1;
  if (!on_policy) detail::require_keys(data, {"old_log_probs"}, method);
  const auto policy_loss_fn = algos::core_algos::get_policy_loss_fn(a.loss.policy_loss.loss_mode);
  const bool with_entropy = a.entropy_coeff != 0.0 || a.calculate_entropy;
  const ForwardBatching micro_batching{.micro_batch_size_per_gpu = a.ppo_micro_batch_size_per_gpu,
                                       .use_dynamic_bsz = a.use_dynamic_bsz,
                                       .max_token_len_per_gpu = a.ppo_max_token_len_per_gpu};

  policy_->train();
  detail::MetricLists metrics;
  double pg_loss_sum = 0.0, kl_loss_sum = 0.0;
  const detail::PpoUpdatePlan plan{.ppo_epochs = a.ppo_epochs,
                                   .micro_batching = micro_batching,
                                   .grad_clip = a.grad_clip,
                                   .prefix = "actor",
                                   .fsdp = policy_fsdp_.get(),
                                   .group = group_.get()};
  detail::ppo_update(mini_batches, plan, *optimizer_, method, metrics, [&](const DataProto& mb, double scale) {
    auto scores =
        detail::response_scores(policy_, policy_fsdp_.get(), mb,
                                models::ScoreOptions{.temperature = temperature, .with_entropy = with_entropy});
    const auto& log_prob = scores.log_probs;
    const auto& mask = mb.batch.at("response_mask");
    const auto old_log_prob = on_policy ? log_prob.detach() : mb.batch.at("old_log_probs");
    std::optional<at::Tensor> is_weights;
    if (mb.batch.contains("rollout_is_weights")) is_weights = mb.batch.at("rollout_is_weights");
    auto pg = policy_loss_fn(old_log_prob, log_prob, mb.batch.at("advantages"), mask, a.loss.loss_agg_mode, a.loss,
                             is_weights);
    auto policy_loss = pg.pg_loss;
    if (with_entropy) {
      auto entropy = algos::core_algos::agg_loss(scores.entropy, mask, a.loss.loss_agg_mode);
      if (a.entropy_coeff != 0.0) policy_loss = policy_loss - entropy * a.entropy_coeff;
      metrics.add("actor/entropy", entropy.item<double>());
    }
    if (a.use_kl_loss) {
      auto kld = algos::core_algos::kl_penalty(log_prob, mb.batch.at("ref_log_prob"), a.kl_loss_type);
      auto kl_loss = algos::core_algos::agg_loss(kld, mask, a.loss.loss_agg_mode);
      policy_loss = policy_loss + kl_loss * a.kl_loss_coef;
      kl_loss_sum += kl_loss.item<double>() * scale;
    }
    (policy_loss * scale).backward();
    pg_loss_sum += pg.pg_loss.item<double>() * scale;
    for (const auto& [name, value] : pg.pg_metrics) metrics.add(name, value);
  });
  metrics.add("actor/pg_loss", pg_loss_sum);
  if (a.use_kl_loss) {
    metrics.add("actor/kl_loss", kl_loss_sum);
    metrics.add("actor/kl_coef", a.kl_loss_coef);
  }
  DataProto out;
  out.meta_info = Json{{"metrics", detail::metrics_json(metrics.lists())}};
  return out;
}

}  // namespace hyflow::workers
