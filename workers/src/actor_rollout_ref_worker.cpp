#include <hyflow/workers/actor_rollout_ref_worker.hpp>

#include "fsdp_model.hpp"
#include "ppo_update.hpp"
#include "worker_common.hpp"

#include <hyflow/actors/call_trace.hpp>
#include <hyflow/agents/agent_rollout.hpp>
#include <hyflow/agents/external_agent.hpp>
#include <hyflow/inference/generation.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/response_scores.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/process_group.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>
#include <hyflow/rollout/rollout_registry.hpp>
#include <hyflow/tokenizers/tokenizer_dir.hpp>
#include <hyflow/workers/micro_batches.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>

namespace hyflow::workers {

namespace fs = std::filesystem;
using detail::require_keys;

namespace {
const std::vector<std::string> kScoreKeys = {"input_ids", "attention_mask", "position_ids", "responses"};

std::string role_arg(const Json& args) {
  if (!args.is_object()) throw ValueError("ActorRolloutRefWorker: init args must be an object, got " + args.dump());
  for (auto it = args.begin(); it != args.end(); ++it)
    if (it.key() != "config" && it.key() != "role")
      throw KeyError("ActorRolloutRefWorker: unknown init arg '" + it.key() + "' (expected config, role)");
  if (!args.contains("role")) throw KeyError("ActorRolloutRefWorker: init args lack 'role'");
  if (!args.at("role").is_string()) throw ValueError("ActorRolloutRefWorker: 'role' must be a string");
  return args.at("role").get<std::string>();
}
}  // namespace

ActorRolloutRefWorker::ActorRolloutRefWorker(const Json& args)
    : config_(parse_actor_rollout_ref_config(args.is_object() && args.contains("config") ? args.at("config") : Json())),
      role_(parse_role(role_arg(args))),
      device_(detail::resolve_device(device())),
      rollout_json_(args.at("config").value("rollout", Json::object())) {  // config_ checked it is an object
  if (has_actor(role_)) {
    const auto& a = config_.actor;
    mini_batch_rows_ = normalized_mini_batch_size(a.ppo_mini_batch_size, config_.rollout.n, world_size(),
                                                  a.use_dynamic_bsz ? std::nullopt : a.ppo_micro_batch_size_per_gpu,
                                                  "actor_rollout_ref.actor.ppo_mini_batch_size");
  }
}

ActorRolloutRefWorker::~ActorRolloutRefWorker() = default;

void ActorRolloutRefWorker::init_model() {
  const fs::path path = config_.model.path;
  const auto& lora = config_.model.lora;
  if (has_actor(role_) || has_rollout(role_)) {
    policy_ = models::load_causal_lm(path);
    policy_->to(device_);
    policy_->model->set_gradient_checkpointing(config_.model.enable_gradient_checkpointing);
    if (lora.enabled()) {
      models::apply_lora(*policy_, lora, {}, models::kLoraInitSeed);
      if (!config_.model.lora_adapter_path.empty())
        models::load_adapter(*policy_, config_.model.lora_adapter_path, path.string());
    }
  }
  // LoRA: the reference policy is the policy with its adapters disabled (no second copy)
  if (has_ref(role_) && !(lora.enabled() && policy_)) {
    ref_ = models::load_causal_lm(path);
    ref_->to(device_);
    ref_->eval();
    for (auto& p : ref_->parameters()) p.set_requires_grad(false);
  }
  group_ =
      detail::process_group_of(*this, {std::chrono::seconds(config_.nccl_timeout), "actor_rollout_ref.nccl_timeout"});
  if (policy_) parallel::broadcast_parameters(policy_->parameters(), group_.get());
  if (ref_) parallel::broadcast_parameters(ref_->parameters(), group_.get());
  if (has_actor(role_)) {
    policy_fsdp_ =
        detail::shard_model(*policy_, group_, config_.actor.fsdp, "actor", "actor_rollout_ref.actor.fsdp_config");
    if (policy_fsdp_)  // steps the trainable shards only (the adapters under LoRA)
      optimizer_ = std::make_unique<parallel::ShardedOptimizer>(policy_fsdp_, config_.actor.optim,
                                                                "actor_rollout_ref.actor.optim");
    else  // trainable_parameters: every parameter without LoRA, the adapters with it
      optimizer_ = std::make_unique<parallel::DataParallelOptimizer>(
          models::trainable_parameters(*policy_), config_.actor.optim, group_, "actor_rollout_ref.actor.optim");
  }
  if (ref_)
    ref_fsdp_ = detail::shard_model(*ref_, group_, config_.ref_fsdp, "ref", "actor_rollout_ref.ref.fsdp_config");
  if (has_rollout(role_)) {
    if (lora.enabled()) merged_ = std::make_unique<models::MergedCopy>(policy_);
    rollout_generator_ = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(config_.rollout.seed + rank()));
    rollout_ = rollout::make_rollout_backend(config_.rollout.name, {.model = merged_ ? merged_->model() : policy_,
                                                                   .device = device_,
                                                                   .config = rollout_json_,
                                                                   .rank = rank(),
                                                                   .world_size = world_size()});
    if (agents::parse_multi_turn_config(rollout_json_).enable)
      agents_ = std::make_unique<agents::AgentRollout>(rollout_json_, tokenizers::read_tokenizer_dir(path.string()));
  }
}

void ActorRolloutRefWorker::require_initialized(const char* method) const {
  const bool ready = (policy_ || ref_);
  if (!ready) throw ValueError(std::string(method) + ": call init_model first");
}

inference::GenerationOptions ActorRolloutRefWorker::generation_options(const DataProto& prompts,
                                                                    const std::string& method) {
  const auto& r = config_.rollout;
  bool do_sample = r.do_sample;
  double temperature = r.temperature, top_p = r.top_p;
  int64_t top_k = r.top_k;
  if (detail::meta_bool(prompts, "validate", false, method)) {
    do_sample = r.val_kwargs.do_sample;
    temperature = r.val_kwargs.temperature;
    top_p = r.val_kwargs.top_p;
    top_k = r.val_kwargs.top_k;
  }
  do_sample = detail::meta_bool(prompts, "do_sample", do_sample, method);
  temperature = detail::meta_double(prompts, "temperature", temperature, method);
  top_p = detail::meta_double(prompts, "top_p", top_p, method);
  top_k = detail::meta_int(prompts, "top_k", top_k, method);

  inference::GenerationOptions options;
  options.max_new_tokens = detail::meta_int(prompts, "response_length", r.response_length, method);
  options.do_sample = do_sample && temperature > 0;
  options.sampling =
      cuda::SamplingOptions{.temperature = temperature, .top_k = top_k, .top_p = top_p, .min_p = r.min_p};
  if (!options.do_sample) options.sampling = cuda::SamplingOptions{.greedy = true};
  options.return_log_probs = r.calculate_log_probs;
  // The decode engine (paged KV cache, continuous batching, shared prefill of the n samples) on
  // float32 CPU policies; generate() falls back to the reference path for other models.
  options.engine = inference::GenerationEngine::kDecode;
  // The KV pool's sizing (docs/inference.md, "KV pool"): gpu_memory_utilization applies on CUDA only.
  options.decode.max_batch = r.max_num_seqs;
  options.decode.gpu_memory_utilization = r.gpu_memory_utilization;
  options.decode.kv_cache_bytes = r.kv_cache_bytes.value_or(0);
  options.decode.dtype = parallel::parse_dtype(r.dtype, "actor_rollout_ref.rollout.dtype") == at::kBFloat16
                             ? inference::DecodeDtype::kBFloat16
                             : inference::DecodeDtype::kModel;
  {
    auto* gen = at::check_generator<at::CPUGeneratorImpl>(*rollout_generator_);
    std::lock_guard lock(rollout_generator_->mutex());
    options.seed = gen->random64();
  }
  return options;
}

DataProto ActorRolloutRefWorker::policy_rollout(const DataProto& input, bool has_rows,
                                                inference::GenerationOptions options, Handoff& handoff) {
  // float32: the engine chooses the tokens and rollout_log_probs scores them with the actor's forward;
  // bf16: the engine's own log-probs (its bf16 forward's) are the rollout's, so the mismatch with the
  // actor is the real one (engine_log_probs)
  options.return_log_probs = engine_log_probs(options);
  // The colocated rollout needs the whole policy: gathered unit by unit, freed after generation.
  // verl's sharding manager times this as "reshard"; the peak counts the full parameters held
  // beyond what the engine held before (the whole model once gathered).
  int64_t before = 0;
  if (policy_fsdp_) {
    before = policy_fsdp_->materialized_bytes();
    policy_fsdp_->reset_peak();
    const auto start = std::chrono::steady_clock::now();
    actors::TraceSpan span("weight_sync", "reshard");  // on this worker's track of the step timeline
    policy_fsdp_->unshard_all();
    span.end();
    handoff.reshard_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  // LoRA: the adapters trained since the last rollout are merged into the served copy here (the
  // rewritten weights' version counters move, so the engine repacks just those)
  // (a sharded policy's gather and its optimizer, which steps the master shards, move no version
  // counter of the parameters: every layer is re-merged then; a replicated engine, one rank or
  // fsdp_size 1 under mixed precision, casts its compute copies in place when their masters
  // changed, which moves their counters like a replicated policy's own update)
  const bool gathered = policy_fsdp_ && policy_fsdp_->mesh().shard_size() > 1;
  if (merged_) merged_->refresh(/*force=*/gathered);
  DataProto out;
  if (has_rows && agents_) {
    out = agents_->generate(merged_ ? merged_->model() : policy_, input, options);
    out.batch.pop("rollout_log_probs");  // the engine's; the worker scores its own (generate_sequences)
  } else if (has_rows) {
    out = rollout_->generate_sequences(input, options);
  }
  // verl's free_cache_engine: the KV pool goes before training (the sharding manager's exit).
  if (config_.rollout.free_cache_engine) rollout_->free_cache_engine();
  if (policy_fsdp_) {
    handoff.peak_extra = std::max<int64_t>(0, policy_fsdp_->peak_materialized_bytes() - before);  // gather to end
    // The gather writes the parameters' storage without bumping their version counters, and a
    // packed copy kept until the next rollout would hold a second full model on every rank,
    // undoing the sharding: a sharded policy keeps only the engine's KV pool and scratch. A
    // replicated engine holds its full compute copies anyway: the packed copy stays, and the
    // next rollout repacks what changed (one cast per weight version).
    if (gathered) rollout_->weights_changed();
    policy_fsdp_->reshard_all();
  }
  if (has_rows && device_.type() != c10::kCPU) out.to(c10::Device(c10::kCPU));
  return out;
}

at::Tensor ActorRolloutRefWorker::rollout_log_probs(const DataProto& rollout,
                                                    const inference::GenerationOptions& options, const char* method) {
  // compute_log_prob's own path (log_probs_of, rollout.log_prob batching, the sharded forward
  // when sharded): for the same rows and weights the two agree bit for bit.
  const double temperature = options.do_sample ? options.sampling.temperature : 1.0;
  const auto& b = rollout.batch;
  DataProto rows(TensorDict{{"input_ids", b.at("input_ids")},
                            {"attention_mask", b.at("attention_mask")},
                            {"position_ids", b.at("position_ids")},
                            {"responses", b.at("responses")}},
                 {}, Json{{"temperature", temperature}});
  const at::Tensor lp =
      log_probs_of(policy_, policy_fsdp_.get(), rows, config_.rollout.log_prob, /*with_entropy=*/false, method)
          .batch.at("log_probs");
  return lp.masked_fill(b.at("response_mask").eq(0), 0.0);
}

void ActorRolloutRefWorker::report_handoff(DataProto& out, Handoff handoff) {
  // Equal on every rank (verl's reduce_timing averages; the peak is the largest rank's), so the
  // parts concatenate: the plain meta_info keys of DP_COMPUTE_PROTO outputs must agree.
  if (policy_fsdp_ && group_) {
    auto time = torch::tensor({handoff.reshard_s}, torch::kDouble);
    auto peak = torch::tensor({handoff.peak_extra}, torch::kLong);
    group_->all_reduce(time, parallel::ReduceOp::sum);
    group_->all_reduce(peak, parallel::ReduceOp::max);
    handoff.reshard_s = time.item<double>() / world_size();
    handoff.peak_extra = peak.item<int64_t>();
  }
  out.meta_info["timing"] = Json{{"reshard", handoff.reshard_s}};
  out.meta_info["reshard_peak_extra_bytes"] = handoff.peak_extra;
}

DataProto ActorRolloutRefWorker::generate_sequences(DataProto prompts) {
  static const std::string method = "generate_sequences";
  if (!has_rollout(role_)) throw ValueError(method + " needs the rollout role; this worker is " + to_string(role_));
  require_initialized("generate_sequences");
  require_keys(prompts, {"input_ids", "attention_mask"}, method);
  const inference::GenerationOptions options = generation_options(prompts, method);
  DataProto input(detail::on_device(prompts, {"input_ids", "attention_mask", "position_ids"}, device_).batch,
                  prompts.non_tensor_batch, prompts.meta_info);
  Handoff handoff;
  DataProto out = policy_rollout(input, /*has_rows=*/true, options, handoff);
  if (options.return_log_probs && !engine_log_probs(options))
    out.batch.set("rollout_log_probs", rollout_log_probs(out, options, method.c_str()));
  stamp_weight_version(out);
  report_handoff(out, handoff);
  return out;
}

Json ActorRolloutRefWorker::decode_stats() const {
  return rollout_ ? rollout_->stats() : Json{{"engine", false}};
}

std::string ActorRolloutRefWorker::open_agent_server() {
  if (!has_rollout(role_))
    throw ValueError(std::string("open_agent_server needs the rollout role; this worker is ") + to_string(role_));
  require_initialized("open_agent_server");
  if (policy_fsdp_) policy_fsdp_->unshard_all();  // the whole policy while outside agents decode
  if (merged_) merged_->refresh(/*force=*/policy_fsdp_ != nullptr);
  return rollout_->open_for_agents();
}

DataProto ActorRolloutRefWorker::collect_agent_sessions(std::vector<std::string> session_ids) {
  if (!has_rollout(role_))
    throw ValueError(std::string("collect_agent_sessions needs the rollout role; this worker is ") + to_string(role_));
  require_initialized("collect_agent_sessions");
  const auto parts = rollout_->collect_sessions(session_ids);
  if (config_.rollout.free_cache_engine) rollout_->free_cache_engine();
  if (policy_fsdp_) {  // as after a rollout: no packed copy of the gathered weights is kept
    rollout_->weights_changed();
    policy_fsdp_->reshard_all();
  }
  return agents::concat_sessions(parts, (merged_ ? merged_->model() : policy_)->config().resolved_pad_token_id());
}

DataProto ActorRolloutRefWorker::log_probs_of(models::CausalLM& model, parallel::FsdpModule* fsdp,
                                              const DataProto& data, const ForwardBatching& batching, bool with_entropy,
                                              const char* method) {
  require_keys(data, {"input_ids", "attention_mask", "responses"}, method);
  const double temperature = detail::meta_double(data, "temperature", config_.rollout.temperature, method);
  torch::NoGradGuard no_grad;
  model->eval();
  auto micro =
      make_micro_batches(detail::on_device(data, kScoreKeys, device_), batching, method, fsdp ? group_.get() : nullptr);
  std::vector<at::Tensor> log_probs, entropy;
  for (const auto& mb : micro.batches) {
    auto scores = detail::response_scores(
        model, fsdp, mb, models::ScoreOptions{.temperature = temperature, .with_entropy = with_entropy});
    log_probs.push_back(scores.log_probs.cpu());
    if (with_entropy) entropy.push_back(scores.entropy.cpu());
  }
  TensorDict out{{"log_probs", torch::cat(log_probs)}};
  if (with_entropy) out.set("entropy", torch::cat(entropy));
  DataProto result = restore_order(DataProto(std::move(out)), micro.order);
  result.meta_info = Json{{"temperature", temperature}};
  return result;
}

DataProto ActorRolloutRefWorker::compute_log_prob(DataProto data) {
  if (!has_actor(role_))
    throw ValueError(std::string("compute_log_prob needs the actor role; this worker is ") + to_string(role_));
  require_initialized("compute_log_prob");
  DataProto out = log_probs_of(policy_, policy_fsdp_.get(), data, config_.rollout.log_prob, /*with_entropy=*/true,
                               "compute_log_prob");
  out.rename({"log_probs", "entropy"}, {"old_log_probs", "entropys"});
  return out;
}

DataProto ActorRolloutRefWorker::compute_ref_log_prob(DataProto data) {
  if (!has_ref(role_))
    throw ValueError(std::string("compute_ref_log_prob needs the ref role; this worker is ") + to_string(role_));
  require_initialized("compute_ref_log_prob");
  DataProto out;
  if (ref_) {
    out = log_probs_of(ref_, ref_fsdp_.get(), data, config_.ref, /*with_entropy=*/false, "compute_ref_log_prob");
  } else {  // LoRA: the base model is the policy without its adapters
    models::DisableAdapters base_only;
    out = log_probs_of(policy_, policy_fsdp_.get(), data, config_.ref, /*with_entropy=*/false, "compute_ref_log_prob");
  }
  out.rename({"log_probs"}, {"ref_log_prob"});
  return out;
}

detail::RoleCheckpoint ActorRolloutRefWorker::checkpoint_role() {
  const bool trained = policy_ && has_actor(role_);
  return {.worker = "ActorRolloutRefWorker",
          .rank = rank(),
          .world_size = world_size(),
          .model = trained ? policy_.get() : nullptr,
          .config = trained ? &policy_->config() : nullptr,
          .fsdp = trained ? policy_fsdp_.get() : nullptr,
          .optimizer = optimizer_.get(),
          .generator = rollout_generator_ ? &*rollout_generator_ : nullptr,
          .group = group_.get(),
          .model_dir = config_.model.path,
          .contents = &config_.actor.checkpoint,
          .lora = trained && config_.model.lora.enabled() ? &config_.model.lora : nullptr,
          .task_type = "CAUSAL_LM"};
}

void ActorRolloutRefWorker::save_checkpoint(std::string dir, int64_t global_step) {
  require_initialized("save_checkpoint");
  detail::save_role_checkpoint(checkpoint_role(), dir, global_step);
}

void ActorRolloutRefWorker::load_checkpoint(std::string dir) {
  require_initialized("load_checkpoint");
  detail::load_role_checkpoint(checkpoint_role(), dir);
  if (merged_ && !policy_fsdp_) merged_->refresh(/*force=*/true);  // sharded: every rollout re-merges
  if (rollout_) rollout_->weights_changed();  // whatever path wrote the weights
}

std::string ActorRolloutRefWorker::parameter_digest() const {
  require_initialized("parameter_digest");
  if (policy_) return detail::sharded_parameter_digest(*policy_, policy_fsdp_.get());
  return detail::sharded_parameter_digest(*ref_, ref_fsdp_.get());
}

void ActorRolloutRefWorker::define_methods(MethodTable<ActorRolloutRefWorker>& t) {
  t.add("init_model", &ActorRolloutRefWorker::init_model, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("generate_sequences", &ActorRolloutRefWorker::generate_sequences, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
  t.add("compute_log_prob", &ActorRolloutRefWorker::compute_log_prob, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
  t.add("compute_ref_log_prob", &ActorRolloutRefWorker::compute_ref_log_prob, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
  t.add("update_actor", &ActorRolloutRefWorker::update_actor, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
  t.add("parameter_digest", &ActorRolloutRefWorker::parameter_digest, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("export_weights", &ActorRolloutRefWorker::export_weights, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("load_weights", &ActorRolloutRefWorker::load_weights, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("weight_version", &ActorRolloutRefWorker::weight_version, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("decode_stats", &ActorRolloutRefWorker::decode_stats, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("open_agent_server", &ActorRolloutRefWorker::open_agent_server, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("collect_agent_sessions", &ActorRolloutRefWorker::collect_agent_sessions,
        {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("continue_sequences", &ActorRolloutRefWorker::continue_sequences, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
  t.add("save_checkpoint", &ActorRolloutRefWorker::save_checkpoint, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("load_checkpoint", &ActorRolloutRefWorker::load_checkpoint, {.dispatch = Dispatch::ONE_TO_ALL});
}

}  // namespace hyflow::workers
