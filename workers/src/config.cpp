#include <hyflow/workers/config.hpp>

#include <hyflow/agents/agent_config.hpp>
#include <hyflow/core/config_section.hpp>

#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/rollout/rollout_registry.hpp>
#include <hyflow/rollout/server_rollout.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <vector>

namespace hyflow::workers {
namespace {

using Section = ConfigSection;

const std::vector<std::string> kLossAggModes = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                                "seq-mean-token-sum-norm"};

void check_loss_agg_mode(const std::string& mode, const std::string& path) {
  require_config(std::find(kLossAggModes.begin(), kLossAggModes.end(), mode) != kLossAggModes.end(), path,
                 "one of token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm", mode);
}

void check_positive(int64_t v, const std::string& path) {
  require_config(v > 0, path, "> 0", v);
}
void check_positive(const std::optional<int64_t>& v, const std::string& path) {
  if (v) check_positive(*v, path);
}

void read_fsdp(Section& owner, Section s, FsdpSection& f);

// target_modules / exclude_modules: a string ("all-linear", or one module name) or a list of names.
std::vector<std::string> module_names(const Json& v, const std::string& path) {
  if (v.is_null()) return {};
  if (v.is_string()) return {v.get<std::string>()};
  std::vector<std::string> out;
  require_config(v.is_array(), path, "a module name or a list of module names", v);
  for (const auto& e : v) {
    require_config(e.is_string(), path, "a list of module names", v);
    out.push_back(e.get<std::string>());
  }
  return out;
}

void read_lora(Section& s, ModelSection& out) {
  auto& l = out.lora;
  s.read("lora_rank", l.rank, {.help = "LoRA rank (0: full fine-tuning; docs/lora.md)", .minimum = 0});
  s.read("lora_alpha", l.alpha, {.help = "LoRA alpha (the update is scaled by alpha / rank)"});
  Json targets = "all-linear", excluded = nullptr;
  s.read("target_modules", targets, {.help = "all-linear or a list of linear layer names LoRA adapts"});
  s.read("exclude_modules", excluded, {.help = "linear layer names LoRA leaves alone", .null_default = true});
  s.read("lora_adapter_path", out.lora_adapter_path,
         {.help = "a PEFT adapter directory to start from (empty: fresh adapters)"});
  if (s.describing()) return;
  l.target_modules = module_names(targets, s.key_path("target_modules"));
  l.exclude_modules = module_names(excluded, s.key_path("exclude_modules"));
  l.validate(s.key_path("").substr(0, s.key_path("").size() - 1));
  require_config(out.lora_adapter_path.empty() || l.enabled(), s.key_path("lora_adapter_path"),
                 "empty when lora_rank is 0", out.lora_adapter_path);
}

void read_model(Section s, ModelSection& out, const char* path_help, Section* owner = nullptr,
                FsdpSection* fsdp = nullptr) {
  if (fsdp) read_fsdp(*owner, s.sub("fsdp_config"), *fsdp);
  s.read("path", out.path, {.help = path_help});
  s.read("enable_gradient_checkpointing", out.enable_gradient_checkpointing, {.help = "recompute activations"});
  read_lora(s, out);
  s.ignore({"use_remove_padding",
            "use_fused_kernels",
            "trust_remote_code",
            "external_lib",
            "override_config",
            "tokenizer_path",
            "use_shm",
            "use_liger",
            "enable_activation_offload",
            "custom_chat_template",
            "fused_kernel_options",
            "input_tokenizer",
            "fsdp_config",
            "_target_",
            "hf_config_path",
            "load_tokenizer",
            "use_torch_compile",
            "dtype"});
  s.finish();
  if (!s.describing()) require_config(!out.path.empty(), s.key_path("path"), "a model directory", out.path);
}

void check_sp(Section& s) {
  int64_t sp = 1;
  s.read("ulysses_sequence_parallel_size", sp, {.help = "sequence parallelism (hyflow: 1 only)"});
  require_config(sp == 1, s.key_path("ulysses_sequence_parallel_size"), "1 (sequence parallelism is not supported yet)",
                 sp);
}

void read_dtype(Section& s, const char* key, std::string& out, const char* help) {
  s.read(key, out, {.help = help});
  if (!s.describing()) parallel::parse_dtype(out, s.key_path(key));
}

// `owner` holds `strategy`; `s` is its fsdp_config.
void read_fsdp(Section& owner, Section s, FsdpSection& f) {
  owner.read("strategy", f.strategy, {.help = "fsdp | fsdp2 (per-parameter shards, docs/parallel.md)"});
  if (!owner.describing())
    require_config(f.strategy == "fsdp" || f.strategy == "fsdp2", owner.key_path("strategy"), "fsdp or fsdp2",
                   f.strategy);
  s.read("fsdp_size", f.fsdp_size, {.help = "ranks per shard group (-1: all; 1: replicate; k: HYBRID_SHARD)"});
  s.read("param_offload", f.param_offload,
         {.help = "sharded fp32 parameters and grads in pinned host memory between uses (CPU: a no-op, said once)"});
  s.read("optimizer_offload", f.optimizer_offload,
         {.help = "sharded AdamW moments in pinned host memory between steps (CPU: a no-op, said once)"});
  s.read("reshard_after_forward", f.reshard_after_forward,
         {.help = "free a unit after forward (false: SHARD_GRAD_OP)"});
  {
    Section w = s.sub("wrap_policy");
    w.read("min_num_params", f.min_num_params, {.help = "smaller decoder layers join the root unit", .minimum = 0});
    w.ignore({"transformer_layer_cls_to_wrap", "_target_"});
    w.finish();
  }
  {
    Section m = s.sub("mixed_precision");
    read_dtype(m, "param_dtype", f.param_dtype, "dtype units compute in (master shards stay fp32)");
    read_dtype(m, "reduce_dtype", f.reduce_dtype, "dtype gradients are reduced in");
    read_dtype(m, "buffer_dtype", f.buffer_dtype, "dtype of buffers");
    m.ignore({"_target_", "keep_low_precision_grads", "cast_forward_inputs"});
    m.finish();
  }
  s.ignore({"_target_", "offload_policy", "forward_prefetch", "model_dtype", "dtype", "use_orig_params",
            "entropy_checkpointing", "forward_only", "use_torch_compile", "ulysses_sequence_parallel_size", "strategy",
            "seed", "full_determinism", "mixed_precision_dtype"});
  s.finish();
  if (s.describing()) return;
  require_config(f.fsdp_size == -1 || f.fsdp_size >= 1, s.key_path("fsdp_size"), "-1 or >= 1", f.fsdp_size);
}

void read_checkpoint(Section s, CheckpointSection& c) {
  static const std::vector<std::string> kContents = {"model", "optimizer", "extra", "hf_model"};
  s.read("save_contents", c.save_contents,
         {.help = "what a checkpoint holds: model, optimizer, extra (RNG), hf_model (docs/parallel.md)"});
  c.load_contents = c.save_contents;  // verl: ${.save_contents}
  s.read("load_contents", c.load_contents,
         {.help = "what resuming restores (null: save_contents)", .null_default = true});
  s.ignore({"async_save", "_target_"});
  s.finish();
  if (s.describing()) return;
  for (const auto* list : {&c.save_contents, &c.load_contents})
    for (const auto& item : *list)
      require_config(std::find(kContents.begin(), kContents.end(), item) != kContents.end(),
                     s.key_path(list == &c.save_contents ? "save_contents" : "load_contents"),
                     "a list of model, optimizer, extra, hf_model", item);
}

void read_optim(Section s, OptimConfig& o) {
  s.read("lr", o.lr, {.help = "learning rate", .minimum = 0});
  s.read("weight_decay", o.weight_decay, {.help = "AdamW weight decay", .minimum = 0});
  std::vector<double> betas{o.betas[0], o.betas[1]};
  s.read("betas", betas, {.help = "AdamW betas"});
  require_config(betas.size() == 2, s.key_path("betas"), "a list of two numbers", betas);
  o.betas = {betas[0], betas[1]};
  s.read("eps", o.eps, {.help = "AdamW epsilon"});
  s.read("lr_warmup_steps", o.lr_warmup_steps, {.help = "warmup steps (< 0: use the ratio)", .minimum = -1});
  s.read("lr_warmup_steps_ratio", o.lr_warmup_steps_ratio, {.help = "warmup steps as a ratio of total steps"});
  // verl renamed warmup_style to lr_scheduler_type; both spellings are read (the old one is not
  // in the key table).
  if (s.has("warmup_style"))
    s.read("warmup_style", o.lr_scheduler_type);
  else
    s.ignore({"warmup_style"});
  s.read("lr_scheduler_type", o.lr_scheduler_type, {.help = "constant | cosine"});
  s.read("min_lr_ratio", o.min_lr_ratio, {.help = "cosine floor"});
  s.read("num_cycles", o.num_cycles, {.help = "cosine cycles"});
  s.read("total_training_steps", o.total_training_steps, {.set_by_trainer = true});
  s.ignore({"clip_grad", "optimizer", "optimizer_impl", "override_optimizer_config", "_target_", "weight_decay_incr",
            "lr_scheduler_kwargs", "zero_indexed_step"});
  s.finish();
  if (s.describing()) return;
  require_config(o.lr >= 0, s.key_path("lr"), ">= 0", o.lr);
  require_config(o.weight_decay >= 0, s.key_path("weight_decay"), ">= 0", o.weight_decay);
  for (double b : o.betas) require_config(b >= 0 && b < 1, s.key_path("betas"), "two numbers in [0, 1)", o.betas);
  require_config(o.eps > 0, s.key_path("eps"), "> 0", o.eps);
  require_config(o.lr_warmup_steps_ratio >= 0 && o.lr_warmup_steps_ratio <= 1, s.key_path("lr_warmup_steps_ratio"),
                 "in [0, 1]", o.lr_warmup_steps_ratio);
  require_config(o.lr_scheduler_type == "constant" || o.lr_scheduler_type == "cosine", s.key_path("lr_scheduler_type"),
                 "constant or cosine", o.lr_scheduler_type);
  require_config(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1, s.key_path("min_lr_ratio"), "in [0, 1]", o.min_lr_ratio);
  if (o.lr_scheduler_type == "cosine")
    require_config(o.total_training_steps > 0, s.key_path("total_training_steps"),
                   "> 0 for the cosine schedule (the trainer sets it)", o.total_training_steps);
  (void)o.resolved_warmup_steps(s.key_path("lr_warmup_steps_ratio"));
}

/// `inherit_from`: where unset dynamic-batching keys take their values ("the actor's"; the
/// table lists them as null); nullptr: the section's own defaults.
void read_forward(Section& s, ForwardBatching& f, const char* micro_key, const char* dyn_key, const char* max_key,
                  const char* inherit_from) {
  const bool inherit = inherit_from != nullptr;
  const std::string from = inherit ? inherit_from : "";
  const std::string micro_help =
      "rows per micro-batch (null: " + (inherit ? from : std::string("the whole chunk at once")) + ")";
  const std::string dyn_help = "token-budget micro-batches" + (inherit ? " (null: " + from + ")" : std::string());
  const std::string max_help = "token budget per micro-batch" + (inherit ? " (null: " + from + ")" : std::string());
  s.read(micro_key, f.micro_batch_size_per_gpu, {.help = micro_help.c_str(), .minimum = 1});
  s.read(dyn_key, f.use_dynamic_bsz, {.help = dyn_help.c_str(), .null_default = inherit});
  s.read(max_key, f.max_token_len_per_gpu, {.help = max_help.c_str(), .null_default = inherit, .minimum = 1});
  check_positive(f.micro_batch_size_per_gpu, s.key_path(micro_key));
  check_positive(f.max_token_len_per_gpu, s.key_path(max_key));
}

void check_kl_type(const std::string& type, const std::string& path) {
  try {
    auto x = torch::zeros({1, 1});
    (void)algos::core_algos::kl_penalty(x, x, type);
  } catch (const Error& e) {
    throw ValueError("config key '" + path + "' has an unknown KL type '" + type + "' (" + e.what() + ")");
  }
}

void read_actor(Section s, ActorSection& a) {
  s.read("ppo_mini_batch_size", a.ppo_mini_batch_size, {.help = "prompts per mini-batch", .minimum = 1});
  s.read("ppo_micro_batch_size_per_gpu", a.ppo_micro_batch_size_per_gpu,
         {.help = "rows per micro-batch (null: one per mini-batch)", .minimum = 1});
  s.read("use_dynamic_bsz", a.use_dynamic_bsz, {.help = "token-budget micro-batches"});
  s.read("ppo_max_token_len_per_gpu", a.ppo_max_token_len_per_gpu,
         {.help = "token budget per micro-batch", .minimum = 1});
  s.read("ppo_epochs", a.ppo_epochs, {.help = "passes over the batch", .minimum = 1});
  s.read("entropy_coeff", a.entropy_coeff, {.help = "entropy bonus"});
  s.read("calculate_entropy", a.calculate_entropy, {.help = "log actor/entropy even when entropy_coeff is 0"});
  s.read("use_kl_loss", a.use_kl_loss, {.help = "KL to the reference as a loss"});
  s.read("kl_loss_coef", a.kl_loss_coef, {.help = "KL loss coefficient"});
  s.read("kl_loss_type", a.kl_loss_type, {.help = "KL estimator of the loss"});
  s.read("grad_clip", a.grad_clip, {.help = "gradient norm clip"});
  auto& l = a.loss;
  s.read("clip_ratio", l.clip_ratio, {.help = "PPO clip", .minimum = 0});
  s.read("clip_ratio_low", l.clip_ratio_low, {.help = "PPO lower clip"});
  s.read("clip_ratio_high", l.clip_ratio_high, {.help = "PPO upper clip"});
  s.read("clip_ratio_c", l.clip_ratio_c, {.help = "dual clip"});
  s.read("loss_agg_mode", l.loss_agg_mode, {.help = "loss aggregation"});
  s.read("loss_scale_factor", l.loss_scale_factor,
         {.help = "seq-mean-token-sum-norm divisor (null: the response length)"});
  s.read("tau_pos", l.tau_pos, {.help = "SAPO: temperature for positive advantages"});
  s.read("tau_neg", l.tau_neg, {.help = "SAPO: temperature for negative advantages"});
  {
    Section p = s.sub("policy_loss");
    p.read("loss_mode", l.policy_loss.loss_mode, {.help = "policy loss"});
    p.read("clip_cov_ratio", l.policy_loss.clip_cov_ratio, {.help = "clip_cov: ratio of tokens clipped"});
    p.read("clip_cov_lb", l.policy_loss.clip_cov_lb, {.help = "clip_cov: covariance lower bound"});
    p.read("clip_cov_ub", l.policy_loss.clip_cov_ub, {.help = "clip_cov: covariance upper bound"});
    p.read("kl_cov_ratio", l.policy_loss.kl_cov_ratio, {.help = "kl_cov: ratio of tokens penalized"});
    p.read("ppo_kl_coef", l.policy_loss.ppo_kl_coef, {.help = "kl_cov: KL coefficient"});
    p.ignore({"_target_"});
    p.finish();
    if (!s.describing()) {
      try {
        (void)algos::core_algos::get_policy_loss_fn(l.policy_loss.loss_mode);
      } catch (const Error& e) {
        throw ValueError("config key '" + p.key_path("loss_mode") + "': " + e.what());
      }
    }
  }
  read_optim(s.sub("optim"), a.optim);
  read_fsdp(s, s.sub("fsdp_config"), a.fsdp);
  read_checkpoint(s.sub("checkpoint"), a.checkpoint);
  check_sp(s);
  s.ignore({"shuffle",
            "data_loader_seed",
            "ppo_micro_batch_size",
            "use_torch_compile",
            "profiler",
            "entropy_checkpointing",
            "entropy_from_logits_with_chunking",
            "use_fused_kernels",
            "_target_",
            "use_remove_padding",
            "rollout_n",
            "ppo_infer_micro_batch_size_per_gpu",
            "ppo_infer_max_token_len_per_gpu",
            "use_prefix_grouper",
            "router_replay",
            "megatron",
            "load_weight",
            "nccl_timeout",
            "engine",
            "sum_pi_squared_checkpointing",
            "calculate_sum_pi_squared",
            "qat",
            "use_rollout_log_probs",
            "freeze_vision_tower"});
  s.finish();
  if (s.describing()) return;
  check_positive(a.ppo_mini_batch_size, s.key_path("ppo_mini_batch_size"));
  check_positive(a.ppo_micro_batch_size_per_gpu, s.key_path("ppo_micro_batch_size_per_gpu"));
  check_positive(a.ppo_max_token_len_per_gpu, s.key_path("ppo_max_token_len_per_gpu"));
  check_positive(a.ppo_epochs, s.key_path("ppo_epochs"));
  require_config(a.grad_clip > 0, s.key_path("grad_clip"), "> 0", a.grad_clip);
  require_config(l.clip_ratio_c > 1, s.key_path("clip_ratio_c"), "> 1", l.clip_ratio_c);
  require_config(l.clip_ratio >= 0, s.key_path("clip_ratio"), ">= 0", l.clip_ratio);
  check_loss_agg_mode(l.loss_agg_mode, s.key_path("loss_agg_mode"));
  if (a.use_kl_loss) check_kl_type(a.kl_loss_type, s.key_path("kl_loss_type"));
}

void read_val_kwargs(Section s, ValKwargs& v) {
  s.read("n", v.n, {.help = "validation samples per prompt", .minimum = 1});
  s.read("do_sample", v.do_sample, {.help = "validation sampling"});
  s.read("temperature", v.temperature, {.help = "validation temperature", .minimum = 0});
  s.read("top_k", v.top_k, {.help = "validation top-k (-1: off)", .minimum = -1});
  s.read("top_p", v.top_p, {.help = "validation top-p"});
  s.ignore({"_target_"});
  s.finish();
  check_positive(v.n, s.key_path("n"));
}

// verl's multi_turn.* and agent.* keys, declared for the key table (INI files and the command line
// take them) and type-checked; the agents module reads them from the rollout section it is given
// (agents::parse_multi_turn_config, docs/agents.md).
void read_agent_keys(Section& s) {
  Section m = s.sub("multi_turn");
  agents::MultiTurnConfig t;
  m.read("enable", t.enable, {.help = "run the rollout's rows through agent loops (docs/agents.md)"});
  m.read("max_assistant_turns", t.max_assistant_turns,
         {.help = "model turns per sample (null: no limit)", .minimum = 0});
  m.read("max_user_turns", t.max_user_turns,
         {.help = "tool and interaction turns per sample (null: no limit)", .minimum = 0});
  m.read("max_parallel_calls", t.max_parallel_calls, {.help = "tool calls run per model turn", .minimum = 1});
  m.read("max_tool_response_length", t.max_tool_response_length,
         {.help = "characters of one tool response", .minimum = 1});
  std::string side = "middle";
  m.read("tool_response_truncate_side", side, {.help = "left | right | middle"});
  m.read("tool_plugins", t.tool_plugins,
         {.help = "shared libraries registering tool classes, loaded before tool_config_path"});
  m.read("tool_config_path", t.tool_config_path, {.help = "verl's tool config YAML (empty: no tools)"});
  m.read("interaction_config_path", t.interaction_config_path,
         {.help = "verl's interaction config YAML (empty: none)"});
  m.read("format", t.format, {.help = "tool-call format of the model (hermes)"});
  m.accept("use_inference_chat_template", false, "accepted for verl compatibility");
  m.accept<std::string>("tokenization_sanity_check_mode", "strict", "accepted for verl compatibility");
  m.finish();
  Section a = s.sub("agent");
  agents::AgentConfig g;
  a.read("num_workers", g.num_workers, {.help = "agent-loop samples run at once per rollout rank", .minimum = 1});
  a.read("default_agent_loop", g.default_agent_loop,
         {.help = "the loop of rows without agent_name (null: tool_agent with multi_turn.enable, else "
                  "single_turn_agent)",
          .null_default = true});
  agents::ExternalAgentConfig x;
  a.read("external_command", x.command,
         {.help = "black-box agent: the program's argv, run by the trainer at every step against the rollout "
                  "router (needs rollout.name=server; empty: off)"});
  a.read("external_timeout", x.timeout, {.help = "black-box agent: seconds the program may run per step"});
  a.read("external_reward", x.reward,
         {.help = "black-box agent: agent (its rewards file, else the reward function) | reward_fn"});
  a.read("external_keep_files", x.keep_files,
         {.help = "black-box agent: keep each step's run folder ({default_local_dir}/external_agent/)"});
  a.finish();
  // data.apply_chat_template_kwargs, copied here by the trainer (agents::parse_chat_template_kwargs)
  Section k = s.sub("apply_chat_template_kwargs");
  agents::ChatTemplateKwargs kwargs;
  k.read("default_system", kwargs.default_system, {.set_by_trainer = true});
  k.read("list_tools", kwargs.list_tools, {.set_by_trainer = true});
  k.finish();
}

void read_rollout(Section s, RolloutSection& r, const ActorSection& actor) {
  s.read("name", r.name, {.help = "rollout backend (built in: hf, the decode engine; docs/rollout.md)"});
  if (!s.describing() && !rollout::has_rollout_backend(r.name))
    throw KeyError("config key '" + s.key_path("name") + "': unknown rollout backend '" + r.name +
                   "' (registered: " + join_names(rollout::rollout_backend_names()) + ")" +
                   did_you_mean(r.name, rollout::rollout_backend_names()));
  s.read("n", r.n, {.help = "samples per prompt", .minimum = 1});
  s.read("temperature", r.temperature, {.help = "sampling temperature", .minimum = 0});
  s.read("top_k", r.top_k, {.help = "top-k (-1: off)", .minimum = -1});
  s.read("top_p", r.top_p, {.help = "top-p"});
  s.read("min_p", r.min_p, {.help = "min-p: drop tokens below min_p x the top probability (0: off)"});
  s.read("do_sample", r.do_sample, {.help = "sample (else greedy)"});
  s.read("prompt_length", r.prompt_length,
         {.help = "prompt tokens (null: data.max_prompt_length)", .null_default = true, .minimum = 1});
  s.read("response_length", r.response_length,
         {.help = "response tokens (null: data.max_response_length)", .null_default = true, .minimum = 1});
  s.read("calculate_log_probs", r.calculate_log_probs, {.help = "return rollout_log_probs"});
  s.read("dtype", r.dtype,
         {.help = "decode engine precision: float32 or bfloat16 (bf16 weights and KV, fp32 sums; docs/inference.md)"});
  if (!s.describing() && parallel::parse_dtype(r.dtype, s.key_path("dtype")) == at::kHalf)
    throw ValueError("config key '" + s.key_path("dtype") + "' must be float32 or bfloat16 (bf16, fp32), got '" +
                     r.dtype + "': the decode engine has no float16 path");
  s.read("seed", r.seed, {.set_by_trainer = true});  // trainer.seed; rank r samples with seed + r
  s.read("gpu_memory_utilization", r.gpu_memory_utilization,
         {.help = "CUDA: the KV pool fits in this x device memory - memory in use (vLLM's); ignored on CPU",
          .minimum = 0});
  s.read("max_num_seqs", r.max_num_seqs, {.help = "most sequences the decode engine runs at once", .minimum = 1});
  s.read("free_cache_engine", r.free_cache_engine, {.help = "release the KV pool after each rollout"});
  s.read("kv_cache_bytes", r.kv_cache_bytes,
         {.help = "hyflow: most bytes of the KV pool, any device (null: no cap)", .minimum = 1});
  read_val_kwargs(s.sub("val_kwargs"), r.val_kwargs);
  read_agent_keys(s);
  // the "server" backend reads these itself from the section the worker passes it
  rollout::ServerRolloutOptions server;
  rollout::read_server_rollout_options(s.sub("server"), server);
  r.log_prob.use_dynamic_bsz = actor.use_dynamic_bsz;
  r.log_prob.max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu;
  read_forward(s, r.log_prob, "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
               "log_prob_max_token_len_per_gpu", "the actor's");
  s.ignore({"mode",
            "tensor_model_parallel_size",
            "data_parallel_size",
            "expert_parallel_size",
            "pipeline_model_parallel_size",
            "max_num_batched_tokens",
            "max_model_len",
            "enforce_eager",
            "cudagraph_capture_sizes",
            "load_format",
            "layered_summon",
            "ignore_eos",
            "enable_chunked_prefill",
            "enable_prefix_caching",
            "disable_log_stats",
            "log_prob_micro_batch_size",
            "engine_kwargs",
            "trace",
            "profiler",
            "over_sample_rate",
            "skip_rollout",
            "skip_dump_dir",
            "update_weights_bucket_megabytes",
            "layer_name_map",
            "_target_",
            "multi_stage_wake_up",
            "custom",
            "enable_rollout_routing_replay",
            "skip_tokenizer_init",
            "limit_images",
            "repetition_penalty",
            "checkpoint_engine",
            "quantization",
            "mtp",
            "prometheus",
            "nnodes",
            "n_gpus_per_node",
            "async_rollout"});
  s.finish();
  if (s.describing()) return;
  check_positive(r.n, s.key_path("n"));
  check_positive(r.response_length, s.key_path("response_length"));
  require_config(r.temperature >= 0, s.key_path("temperature"), ">= 0", r.temperature);
  require_config(r.top_p > 0 && r.top_p <= 1, s.key_path("top_p"), "in (0, 1]", r.top_p);
  require_config(r.min_p >= 0 && r.min_p <= 1, s.key_path("min_p"), "in [0, 1]", r.min_p);
  require_config(r.gpu_memory_utilization > 0 && r.gpu_memory_utilization <= 1, s.key_path("gpu_memory_utilization"),
                 "in (0, 1]", r.gpu_memory_utilization);
  require_config(!r.do_sample || r.temperature > 0, s.key_path("temperature"), "> 0 when do_sample is true",
                 r.temperature);
}

}  // namespace

bool CheckpointSection::saves(const std::string& what) const {
  return std::find(save_contents.begin(), save_contents.end(), what) != save_contents.end();
}
bool CheckpointSection::loads(const std::string& what) const {
  return std::find(load_contents.begin(), load_contents.end(), what) != load_contents.end();
}

Role parse_role(const std::string& role) {
  if (role == "actor") return Role::actor;
  if (role == "rollout") return Role::rollout;
  if (role == "ref") return Role::ref;
  if (role == "actor_rollout") return Role::actor_rollout;
  if (role == "actor_rollout_ref") return Role::actor_rollout_ref;
  throw ValueError("unknown ActorRolloutRefWorker role '" + role +
                   "' (valid: actor, rollout, ref, actor_rollout, actor_rollout_ref)");
}

const char* to_string(Role role) {
  switch (role) {
    case Role::actor:
      return "actor";
    case Role::rollout:
      return "rollout";
    case Role::ref:
      return "ref";
    case Role::actor_rollout:
      return "actor_rollout";
    case Role::actor_rollout_ref:
      return "actor_rollout_ref";
  }
  return "?";
}

bool has_actor(Role r) {
  return r == Role::actor || r == Role::actor_rollout || r == Role::actor_rollout_ref;
}
bool has_rollout(Role r) {
  return r == Role::rollout || r == Role::actor_rollout || r == Role::actor_rollout_ref;
}
bool has_ref(Role r) {
  return r == Role::ref || r == Role::actor_rollout_ref;
}

namespace {

void read_actor_rollout_ref(Section s, ActorRolloutRefConfig& c) {
  read_model(s.sub("model"), c.model, "model directory (Hugging Face format)");
  read_actor(s.sub("actor"), c.actor);
  read_rollout(s.sub("rollout"), c.rollout, c.actor);
  {
    Section r = s.sub("ref");
    c.ref.use_dynamic_bsz = c.actor.use_dynamic_bsz;
    c.ref.max_token_len_per_gpu = c.actor.ppo_max_token_len_per_gpu;
    read_forward(r, c.ref, "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
                 "log_prob_max_token_len_per_gpu", "the actor's");
    read_fsdp(r, r.sub("fsdp_config"), c.ref_fsdp);
    check_sp(r);
    r.ignore({"log_prob_micro_batch_size", "use_torch_compile", "profiler", "entropy_checkpointing",
              "entropy_from_logits_with_chunking", "_target_", "model", "megatron", "load_weight", "router_replay",
              "rollout_n"});
    r.finish();
  }
  s.read("nccl_timeout", c.nccl_timeout,
         {.help = "seconds a collective of the worker's NCCL group may run before it is aborted (the roles of a "
                  "worker share the group: critic.nccl_timeout must be equal)",
          .minimum = 1});
  s.ignore({"hybrid_engine", "_target_"});
  s.finish();
}

void read_critic(Section s, CriticConfig& c) {
  c.optim.lr = 1e-5;  // verl's critic default
  read_model(s.sub("model"), c.model, "value model directory (empty: the actor's)", &s, &c.fsdp);
  read_optim(s.sub("optim"), c.optim);
  s.read("ppo_mini_batch_size", c.ppo_mini_batch_size,
         {.help = "prompts per mini-batch (null: the actor's)", .null_default = true, .minimum = 1});
  s.read("ppo_micro_batch_size_per_gpu", c.ppo_micro_batch_size_per_gpu,
         {.help = "rows per micro-batch (null: the actor's)", .minimum = 1});
  s.read("use_dynamic_bsz", c.use_dynamic_bsz, {.help = "token-budget micro-batches"});
  s.read("ppo_max_token_len_per_gpu", c.ppo_max_token_len_per_gpu, {.help = "token budget", .minimum = 1});
  c.forward.micro_batch_size_per_gpu = c.ppo_micro_batch_size_per_gpu;
  c.forward.use_dynamic_bsz = c.use_dynamic_bsz;
  c.forward.max_token_len_per_gpu = c.ppo_max_token_len_per_gpu;
  s.read("forward_micro_batch_size_per_gpu", c.forward.micro_batch_size_per_gpu,
         {.help = "rows per forward micro-batch (null: ppo_micro_batch_size_per_gpu)", .minimum = 1});
  s.read("forward_max_token_len_per_gpu", c.forward.max_token_len_per_gpu,
         {.help = "token budget of a forward micro-batch (null: ppo_max_token_len_per_gpu)",
          .null_default = true,
          .minimum = 1});
  s.read("ppo_epochs", c.ppo_epochs,
         {.help = "passes over the batch (null: the actor's)", .null_default = true, .minimum = 1});
  s.read("cliprange_value", c.cliprange_value, {.help = "value clip", .minimum = 0});
  s.read("loss_agg_mode", c.loss_agg_mode, {.help = "loss aggregation (null: the actor's)", .null_default = true});
  s.read("grad_clip", c.grad_clip, {.help = "gradient norm clip"});
  s.read("rollout_n", c.rollout_n, {.set_by_trainer = true});  // actor_rollout_ref.rollout.n
  s.read("nccl_timeout", c.nccl_timeout,
         {.help = "seconds a collective of the worker's NCCL group may run (must equal "
                  "actor_rollout_ref.nccl_timeout: the critic shares the actor's worker and group)",
          .minimum = 1});
  check_sp(s);
  read_checkpoint(s.sub("checkpoint"), c.checkpoint);
  s.ignore({"shuffle", "data_loader_seed", "enable", "ppo_micro_batch_size", "forward_micro_batch_size", "profiler",
            "use_torch_compile", "_target_", "megatron", "load_weight", "engine", "loss_scale_factor"});
  s.finish();
  if (s.describing()) return;
  check_positive(c.ppo_mini_batch_size, s.key_path("ppo_mini_batch_size"));
  check_positive(c.ppo_micro_batch_size_per_gpu, s.key_path("ppo_micro_batch_size_per_gpu"));
  check_positive(c.forward.micro_batch_size_per_gpu, s.key_path("forward_micro_batch_size_per_gpu"));
  check_positive(c.ppo_max_token_len_per_gpu, s.key_path("ppo_max_token_len_per_gpu"));
  check_positive(c.forward.max_token_len_per_gpu, s.key_path("forward_max_token_len_per_gpu"));
  check_positive(c.ppo_epochs, s.key_path("ppo_epochs"));
  check_positive(c.rollout_n, s.key_path("rollout_n"));
  require_config(c.cliprange_value >= 0, s.key_path("cliprange_value"), ">= 0", c.cliprange_value);
  require_config(c.grad_clip > 0, s.key_path("grad_clip"), "> 0", c.grad_clip);
  check_loss_agg_mode(c.loss_agg_mode, s.key_path("loss_agg_mode"));
}

void read_reward_model(Section s, RewardModelConfig& c) {
  read_model(s.sub("model"), c.model, "reward model directory");
  if (!s.describing())
    require_config(!c.model.lora.enabled(), s.key_path("model.lora_rank"), "0 (the reward model is not trained)",
                   c.model.lora.rank);
  read_forward(s, c.forward, "micro_batch_size_per_gpu", "use_dynamic_bsz", "forward_max_token_len_per_gpu", nullptr);
  s.read("nccl_timeout", c.nccl_timeout, {.minimum = 1, .set_by_trainer = true});  // actor_rollout_ref.nccl_timeout
  check_sp(s);
  s.ignore({"enable", "enable_resource_pool", "n_gpus_per_node", "nnodes", "strategy", "micro_batch_size", "max_length",
            "reward_manager", "launch_reward_fn_async", "sandbox_fusion", "use_reward_loop", "reward_kwargs",
            "profiler", "_target_", "reward_loop_source", "reward_loop_module_path", "reward_loop_class_name",
            "num_workers", "rollout"});
  s.finish();
}

}  // namespace

ActorRolloutRefConfig parse_actor_rollout_ref_config(const Json& json) {
  ActorRolloutRefConfig c;
  read_actor_rollout_ref(Section(json, "actor_rollout_ref"), c);
  return c;
}

CriticConfig parse_critic_config(const Json& json) {
  CriticConfig c;
  read_critic(Section(json, "critic"), c);
  return c;
}

RewardModelConfig parse_reward_model_config(const Json& json) {
  RewardModelConfig c;
  read_reward_model(Section(json, "reward_model"), c);
  return c;
}

OptimConfig parse_optim_config(const Json& json, const std::string& path, OptimConfig defaults) {
  read_optim(Section(json, path), defaults);
  return defaults;
}

std::vector<ConfigKey> optim_config_keys(const std::string& path, OptimConfig defaults) {
  std::vector<ConfigKey> keys;
  read_optim(Section(Json(), path, &keys), defaults);
  return keys;
}

std::vector<ConfigKey> worker_config_keys() {
  std::vector<ConfigKey> keys;
  ActorRolloutRefConfig arr;
  read_actor_rollout_ref(Section(Json(), "actor_rollout_ref", &keys), arr);
  CriticConfig critic;
  read_critic(Section(Json(), "critic", &keys), critic);
  RewardModelConfig rm;
  read_reward_model(Section(Json(), "reward_model", &keys), rm);
  return keys;
}

}  // namespace hyflow::workers
