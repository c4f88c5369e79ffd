// The trainer -> rollout weight handoff (export_weights / load_weights), the weight version every
// rollout row records, and partial rollouts (continue_sequences) of ActorRolloutRefWorker.
// See docs/workers.md, "Separate rollout group".
#include <hyflow/workers/actor_rollout_ref_worker.hpp>

#include "worker_common.hpp"

#include <hyflow/rollout/rollout_backend.hpp>

#include <hyflow/models/checkpoint.hpp>
#include <hyflow/parallel/fsdp.hpp>

#include <torch/torch.h>

#include <map>

namespace hyflow::workers {

namespace {
const char* const kMinVersion = "min_weight_version";
const char* const kMaxVersion = "max_weight_version";
}  // namespace

DataProto ActorRolloutRefWorker::export_weights() {
  if (!has_actor(role_))
    throw ValueError(std::string("export_weights needs the actor role; this worker is ") + to_string(role_));
  require_initialized("export_weights");
  torch::NoGradGuard no_grad;
  TensorDict state;
  int64_t count = 0;
  // a copy: the actor keeps training while the rollout group loads this version
  auto keep = [&](const std::string& name, const at::Tensor& full) {
    state.set(name, full.detach().to(c10::Device(c10::kCPU)).clone().unsqueeze(0));
    ++count;
  };
  if (policy_fsdp_) {
    // Sharded: every rank takes part in gathering unit by unit (never the whole model at once);
    // rank 0 keeps the copies and answers.
    policy_fsdp_->for_each_full_parameter([&](const std::string& name, const at::Tensor& full) {
      if (rank() == 0) keep(name, full);
    });
    if (rank() != 0) return DataProto();
  } else {
    // Replicated: every rank holds the full state, so only rank 0 answers. LoRA: only the
    // adapters travel (the rollout group holds the same frozen base).
    if (rank() != 0) return DataProto();
    for (const auto& [name, t] : models::named_trainable_parameters(*policy_)) keep(name, t);
  }
  int64_t bytes = 0;
  for (const auto& [name, t] : state) bytes += t.numel() * t.element_size();
  return DataProto(std::move(state), {},
                   Json{{"num_parameters", count}, {"sync_bytes", bytes}, {"lora", config_.model.lora.enabled()}});
}

void ActorRolloutRefWorker::load_weights(DataProto weights) {
  static const std::string method = "load_weights";
  if (!has_rollout(role_)) throw ValueError(method + " needs the rollout role; this worker is " + to_string(role_));
  require_initialized("load_weights");
  const int64_t version = detail::meta_int(weights, "weight_version", -1, method);
  if (version < 0)
    throw ValueError(method + ": meta_info['weight_version'] must be an integer >= 0, got " +
                     weights.meta_info.value("weight_version", Json()).dump());
  if (weights.size() != 1)
    throw ShapeError(method + ": the weights must be one row (as export_weights gives), got " +
                     std::to_string(weights.size()));
  models::NamedTensors tensors;
  for (const auto& [name, t] : weights.batch) tensors.emplace_back(name, t.select(0, 0));
  const std::string source = method + " of weight version " + std::to_string(version);
  const bool lora_weights = weights.meta_info.value("lora", false);
  if (lora_weights != config_.model.lora.enabled())
    throw ValueError(source + ": the trainer sent " + (lora_weights ? "LoRA adapters only" : "full weights") +
                     " while this rollout group's actor_rollout_ref.model.lora_rank is " +
                     std::to_string(config_.model.lora.rank));
  if (merged_) {
    // the adapters into policy_ (by name, every one required), merged into the served copy
    std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
    torch::NoGradGuard no_grad;
    for (auto& [name, param] : models::named_trainable_parameters(*policy_)) {
      auto it = by_name.find(name);
      if (it == by_name.end()) throw FormatError(source + ": adapter tensor '" + name + "' is missing");
      if (it->second.sizes() != param.sizes())
        throw FormatError(source + ": adapter tensor '" + name + "' has another shape than the model's");
      param.copy_(it->second);
      by_name.erase(it);
    }
    if (!by_name.empty())
      throw FormatError(source + ": tensor '" + by_name.begin()->first + "' is not an adapter of this model");
    merged_->refresh();
  } else {
    rollout_->load_weights(tensors, source);
  }
  weight_version_ = version;
}

int64_t ActorRolloutRefWorker::weight_version() const {
  return weight_version_.value_or(-1);
}

void ActorRolloutRefWorker::stamp_weight_version(DataProto& rollout) const {
  if (!weight_version_) return;
  const auto versions = torch::full({rollout.size()}, *weight_version_, torch::kLong);
  rollout.batch.set(kMinVersion, versions);
  rollout.batch.set(kMaxVersion, versions.clone());
}

DataProto ActorRolloutRefWorker::continue_sequences(DataProto partial) {
  static const std::string method = "continue_sequences";
  if (!has_rollout(role_)) throw ValueError(method + " needs the rollout role; this worker is " + to_string(role_));
  require_initialized("continue_sequences");
  detail::require_keys(partial, {"prompts", "responses", "response_mask", "attention_mask", "position_ids"}, method);
  const inference::GenerationOptions options = generation_options(partial, method);
  if (partial.batch.contains("rollout_log_probs") != options.return_log_probs)
    throw ValueError(method + ": the partial batch " +
                     (options.return_log_probs ? "lacks rollout_log_probs" : "has rollout_log_probs") +
                     " while actor_rollout_ref.rollout.calculate_log_probs is " +
                     (options.return_log_probs ? "true" : "false"));
  const auto& b = partial.batch;
  const at::Tensor prompts = b.at("prompts"), responses = b.at("responses"), mask = b.at("response_mask");
  const int64_t B = responses.size(0), P = prompts.size(1), R1 = responses.size(1), R2 = options.max_new_tokens;
  if (b.at("attention_mask").size(1) != P + R1)
    throw ShapeError(method + ": attention_mask has " + std::to_string(b.at("attention_mask").size(1)) +
                     " columns, prompts + responses " + std::to_string(P + R1));

  // A row goes on when its response used every column and its last token is not an EOS.
  const auto& config = policy_->config();
  const at::Tensor last = responses.select(1, R1 - 1);
  at::Tensor open = mask.select(1, R1 - 1).to(torch::kBool);
  if (!config.eos_token_ids.empty())
    open = open.logical_and(at::isin(last, torch::tensor(config.eos_token_ids, last.options())).logical_not());
  const at::Tensor rows = open.nonzero().flatten();

  const int64_t pad = config.resolved_pad_token_id();
  at::Tensor more = torch::full({B, R2}, pad, responses.options());
  at::Tensor more_mask = torch::zeros({B, R2}, mask.options());
  // Every rank takes part (a sharded policy is gathered by all), also one without open rows.
  DataProto input;
  if (rows.numel() > 0) {
    // the rows' prompt + response so far is their new (left-padded, contiguous) prompt
    TensorDict in{{"input_ids", b.at("input_ids").index_select(0, rows)},
                  {"attention_mask", b.at("attention_mask").index_select(0, rows)},
                  {"position_ids", b.at("position_ids").index_select(0, rows)}};
    input = detail::on_device(DataProto(std::move(in)), {"input_ids", "attention_mask", "position_ids"}, device_);
  }
  Handoff handoff;
  DataProto out = policy_rollout(input, rows.numel() > 0, options, handoff);
  at::Tensor more_lp;  // the engine's own log-probs of the new columns (bf16 rollout)
  if (engine_log_probs(options)) more_lp = torch::zeros({B, R2}, torch::kFloat);
  if (rows.numel() > 0) {
    more.index_copy_(0, rows, out.batch.at("responses").to(more.dtype()));
    more_mask.index_copy_(0, rows, out.batch.at("response_mask").to(more_mask.dtype()));
    if (more_lp.defined()) more_lp.index_copy_(0, rows, out.batch.at("rollout_log_probs").to(torch::kFloat));
  }

  const at::Tensor all_responses = torch::cat({responses, more}, 1);
  const at::Tensor all_mask = torch::cat({mask, more_mask}, 1);
  const at::Tensor prompt_pos = b.at("position_ids").narrow(1, 0, P);
  const at::Tensor response_pos =
      prompt_pos.select(1, P - 1).unsqueeze(1) + torch::arange(1, R1 + R2 + 1, prompt_pos.options()).unsqueeze(0);
  DataProto result = partial;
  result.batch.set("responses", all_responses);
  result.batch.set("response_mask", all_mask);
  result.batch.set("input_ids", torch::cat({prompts, all_responses}, 1));
  result.batch.set("attention_mask", torch::cat({b.at("attention_mask").narrow(1, 0, P), all_mask}, 1));
  result.batch.set("position_ids", torch::cat({prompt_pos, response_pos}, 1));
  if (options.return_log_probs) {
    // Each segment keeps the log-probs of the weights that generated it: the earlier columns as
    // they were, the new ones scored now (the whole batch, a collective when sharded) with the
    // current weights; ended rows have a 0 mask there, hence 0.
    const at::Tensor now =
        more_lp.defined() ? more_lp : rollout_log_probs(result, options, method.c_str()).narrow(1, R1, R2);
    result.batch.set("rollout_log_probs", torch::cat({b.at("rollout_log_probs").to(torch::kFloat), now}, 1));
  }
  if (weight_version_) {
    // continued rows now also come from this version; rows that had ended keep their span
    const at::Tensor now = torch::full({B}, *weight_version_, torch::kLong);
    const at::Tensor old_min = b.contains(kMinVersion) ? b.at(kMinVersion) : now;
    const at::Tensor old_max = b.contains(kMaxVersion) ? b.at(kMaxVersion) : now;
    result.batch.set(kMinVersion, torch::where(open, torch::minimum(old_min, now), old_min));
    result.batch.set(kMaxVersion, torch::where(open, torch::maximum(old_max, now), old_max));
  }
  report_handoff(result, handoff);
  return result;
}

}  // namespace hyflow::workers
