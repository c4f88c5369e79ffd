// The PPO trainer's sections, read (and declared) with ConfigSection, and the checks that span
// keys. Help lines here are what --help prints.
#include <hyflow/trainer/ppo_config.hpp>

#include <hyflow/algos/core_algos.hpp>
#include <hyflow/core/config_section.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/tracking/prometheus_tracker.hpp>
#include <hyflow/tracking/tracking.hpp>
#include <hyflow/trainer/worker_roles.hpp>
#include <hyflow/workers/config.hpp>

#include <algorithm>

namespace hyflow::trainer {
namespace {

using Section = ConfigSection;
using Json = nlohmann::json;

template <class V>
void require_one_of(const std::string& value, std::initializer_list<const char*> allowed, const std::string& path,
                    const V& shown) {
  for (const char* a : allowed)
    if (value == a) return;
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : " | ") + std::string(a);
  require_config(false, path, "one of " + list, shown);
}

void read_data(Section s, DataSection& d) {
  s.read("train_files", d.train_files,
         {.help = "JSONL or Parquet training file(s), comma separated; empty: data.synthetic"});
  s.read("val_files", d.val_files, {.help = "JSONL or Parquet validation file(s); empty: data.synthetic"});
  s.read("prompt_key", d.prompt_key, {.help = "column with the prompt (chat messages or text)"});
  s.accept<std::string>("reward_fn_key", "data_source",
                        "accepted for verl compatibility (hyflow's reward managers route by data_source)");
  s.read("max_prompt_length", d.max_prompt_length, {.help = "prompt tokens (left-padded)", .minimum = 1});
  s.read("max_response_length", d.max_response_length, {.help = "response tokens", .minimum = 1});
  s.read("train_batch_size", d.train_batch_size, {.help = "prompts per step", .minimum = 1});
  s.read("gen_batch_size", d.gen_batch_size,
         {.help = "prompts per generation batch with algorithm.filter_groups (null: data.train_batch_size)",
          .minimum = 1});
  s.read("val_batch_size", d.val_batch_size, {.help = "validation prompts per batch (null: all)", .minimum = 1});
  s.read("shuffle", d.shuffle, {.help = "shuffle the training set every epoch"});
  s.read("seed", d.seed, {.help = "shuffle seed (null: 1)"});
  s.read("truncation", d.truncation, {.help = "error | left | right | middle"});
  s.read("filter_overlong_prompts", d.filter_overlong_prompts, {.help = "drop prompts longer than max_prompt_length"});
  s.accept("return_raw_chat", true, "accepted for verl compatibility");
  s.accept<int64_t>("dataloader_num_workers", 8, "accepted for verl compatibility");
  {
    Section y = s.sub("synthetic");
    auto& t = d.synthetic;
    y.read("task", t.task, {.help = "built-in task when no files are given"});
    y.read("train_size", t.train_size, {.help = "built-in task: training prompts", .minimum = 1});
    y.read("val_size", t.val_size, {.help = "built-in task: validation prompts", .minimum = 1});
    y.read("max_operand", t.max_operand, {.help = "built-in task: operands in [0, max_operand]", .minimum = 0});
    y.read("seed", t.seed, {.help = "built-in task: generator seed"});
    y.finish();
  }
  {
    Section k = s.sub("apply_chat_template_kwargs");
    k.read("default_system", d.default_system,
           {.help = "agent loops: the system turn of rows without one (null: the template's; docs/agents.md)"});
    k.read("list_tools", d.list_tools, {.help = "agent loops: the tools' schemas in the system turn"});
    k.finish();
  }
  s.finish();
  if (s.describing()) return;
  require_one_of(d.truncation, {"error", "left", "right", "middle"}, s.key_path("truncation"), d.truncation);
}

/// The trainer's keys inside actor_rollout_ref (the rest is the workers').
void read_actor_rollout_ref_keys(Section s, AsyncSection& a) {
  s.accept("hybrid_engine", true, "actor and rollout in one worker (hyflow: always, or trainer.v1 separate_async)");
  s.sub("model").accept("use_remove_padding", true, "accepted for verl compatibility");
  s.sub("actor").accept("shuffle", false, "accepted for verl compatibility");
  Section r = s.sub("rollout");
  r.accept<std::string>("mode", "sync", "accepted for verl compatibility");
  r.read("nnodes", a.rollout_nnodes, {.help = "trainer.v1.trainer_mode=separate_async: rollout nodes", .minimum = 1});
  r.read("n_gpus_per_node", a.rollout_n_gpus_per_node,
         {.help = "trainer.v1.trainer_mode=separate_async: rollout workers per node", .minimum = 1});
}

void read_async(Section v1, Section training, AsyncSection& a) {
  v1.read("trainer_mode", a.trainer_mode,
          {.help = "sync (one colocated group) | colocate_async (the same group, the next batches generating while "
                   "the controller scores and prepares) | separate_async (a rollout group of its own, generating "
                   "ahead)"});
  v1.sub("colocate_async")
      .read("num_warmup_batches", a.colocate_num_warmup_batches,
            {.help = "colocate_async: generation batches issued ahead of training (1: one-step-off)", .minimum = 1});
  Section sep = v1.sub("separate_async");
  sep.read("num_warmup_batches", a.separate_num_warmup_batches,
           {.help = "separate_async: generation batches in flight ahead of training (1: one-step-off)", .minimum = 1});
  sep.read("parameter_sync_step", a.parameter_sync_step,
           {.help = "separate_async: publish the weights to the rollout group every N training steps (verl's default "
                    "is 4; hyflow keeps 1, one-step-off)",
            .minimum = 1});
  Section sampler = v1.sub("sampler");
  sampler.read("max_off_policy_threshold", a.max_off_policy_threshold,
               {.help = "colocate_async, separate_async: most weight versions a trajectory may lag the trained policy",
                .minimum = 0});
  sampler.read("max_off_policy_strategy", a.max_off_policy_strategy,
               {.help = "async modes, beyond the threshold: drop (discard the prompt group) | wait (hold generation "
                        "back)"});
  sampler.read("max_requeues", a.max_requeues,
               {.help = "async modes with drop: generate a dropped prompt group again on newer weights, at most this "
                        "often per prompt (0: dropped groups are used up)",
                .minimum = 0});
  training.read("partial_rollout", a.partial_rollout,
                {.help = "separate_async: generate in segments; a weight update between them continues the rows on the "
                         "new version"});
  training.read("partial_rollout_segments", a.partial_rollout_segments,
                {.help = "separate_async with partial_rollout: segments a response is generated in", .minimum = 1});
  training.finish();
  if (v1.describing()) return;
  require_one_of(a.trainer_mode, {"sync", "colocate_async", "separate_async"}, v1.key_path("trainer_mode"),
                 a.trainer_mode);
  require_one_of(a.max_off_policy_strategy, {"drop", "wait"}, sampler.key_path("max_off_policy_strategy"),
                 a.max_off_policy_strategy);
}

void read_rollout_correction(Section s, RolloutCorrectionSection& r) {
  s.read("rollout_is", r.rollout_is,
         {.help = "importance weights old/rollout policy: token | sequence (null: off; needs "
                  "rollout.calculate_log_probs)"});
  s.read("rollout_is_threshold", r.rollout_is_threshold,
         {.help = "upper truncation of the rollout correction weights", .minimum = 0});
  s.read("rollout_is_batch_normalize", r.rollout_is_batch_normalize,
         {.help = "divide the truncated IS weights by their batch mean"});
  s.read("rollout_rs", r.rollout_rs,
         {.help = "rejection sampling: token | sequence | geometric (null: off; needs rollout.calculate_log_probs)"});
  s.read("rollout_rs_threshold", r.rollout_rs_threshold,
         {.help = "rejection sampling: upper bound of the ratio (required with rollout_rs)", .minimum = 0});
  s.read("rollout_rs_threshold_lower", r.rollout_rs_threshold_lower,
         {.help = "rejection sampling: lower bound of the ratio (null: 1 / rollout_rs_threshold)", .minimum = 0});
  s.read("rollout_token_veto_threshold", r.rollout_token_veto_threshold,
         {.help = "reject a whole response with any token ratio below this (null: off)", .minimum = 0});
  s.read("bypass_mode", r.bypass_mode,
         {.help = "use the rollout's log-probs as old_log_probs instead of recomputing them with the actor"});
  s.finish();
  if (s.describing()) return;
  if (r.rollout_is) {
    require_one_of(*r.rollout_is, {"token", "sequence"}, s.key_path("rollout_is"), *r.rollout_is);
    require_config(r.rollout_is_threshold > 0, s.key_path("rollout_is_threshold"), "> 0", r.rollout_is_threshold);
  }
  if (r.rollout_rs) {
    if (!r.rollout_rs_threshold)
      throw ValueError("config key '" + s.key_path("rollout_rs_threshold") + "' is required with " +
                       s.key_path("rollout_rs"));
    require_one_of(*r.rollout_rs, {"token", "sequence", "geometric"}, s.key_path("rollout_rs"), *r.rollout_rs);
    const double upper = *r.rollout_rs_threshold, lower = r.rollout_rs_threshold_lower.value_or(1.0 / upper);
    require_config(upper > 0, s.key_path("rollout_rs_threshold"), "> 0", upper);
    require_config(lower > 0 && lower <= upper, s.key_path("rollout_rs_threshold_lower"),
                   "in (0, rollout_rs_threshold = " + std::to_string(upper) + "]", lower);
  }
  if (r.rollout_token_veto_threshold)
    require_config(*r.rollout_token_veto_threshold > 0, s.key_path("rollout_token_veto_threshold"), "> 0",
                   *r.rollout_token_veto_threshold);
  if (r.bypass_mode && r.corrects())
    throw ValueError("config key '" + s.key_path("bypass_mode") +
                     "' with rollout_is, rollout_rs or rollout_token_veto_threshold: bypass takes the rollout's "
                     "log-probs as old_log_probs, so their ratio is 1 and there is nothing to correct (verl applies "
                     "them inside its bypass policy loss, not built here)");
}

void read_algorithm(Section s, AlgorithmSection& a) {
  s.read("adv_estimator", a.adv_estimator, {.help = "advantage estimator"});
  s.read("gamma", a.gamma, {.help = "discount", .minimum = 0});
  s.read("lam", a.lam, {.help = "GAE lambda", .minimum = 0});
  s.read("norm_adv_by_std_in_grpo", a.norm_adv_by_std_in_grpo, {.help = "GRPO: divide by the group std"});
  s.read("use_kl_in_reward", a.use_kl_in_reward, {.help = "KL penalty in the reward"});
  s.read("kl_penalty", a.kl_penalty, {.help = "KL estimator in the reward"});
  {
    Section k = s.sub("kl_ctrl");
    k.read("type", a.kl_ctrl.type, {.help = "fixed | adaptive"});
    k.read("kl_coef", a.kl_ctrl.kl_coef, {.help = "KL coefficient", .minimum = 0});
    k.read("horizon", a.kl_ctrl.horizon, {.help = "adaptive horizon", .minimum = 1});
    k.read("target_kl", a.kl_ctrl.target_kl, {.help = "adaptive target", .minimum = 0});
    k.finish();
    if (!k.describing()) require_one_of(a.kl_ctrl.type, {"fixed", "adaptive"}, k.key_path("type"), a.kl_ctrl.type);
  }
  {
    Section f = s.sub("filter_groups");
    f.read("enable", a.filter_groups.enable,
           {.help = "DAPO dynamic sampling: drop prompt groups whose metric is equal for all samples, regenerate "
                    "until full"});
    f.read("metric", a.filter_groups.metric,
           {.help = "acc | score | seq_reward | seq_final_reward | another reward_extra_info column"});
    f.read("max_num_gen_batches", a.filter_groups.max_num_gen_batches,
           {.help = "generation batches allowed per step (0 or less: unlimited)"});
    f.finish();
  }
  read_rollout_correction(s.sub("rollout_correction"), a.rollout_correction);
  s.finish();
  if (s.describing()) return;
  try {
    (void)algos::core_algos::get_adv_estimator_fn(a.adv_estimator);
  } catch (const KeyError& e) {
    throw KeyError("config key '" + s.key_path("adv_estimator") + "': " + e.what());
  }
}

void read_prometheus(Section s, tracking::PrometheusEndpoint& p) {
  s.read("port", p.port,
         {.help = "the prometheus tracker's GET /metrics port; required with it (0: a free port, printed)",
          .minimum = 0});
  s.read("bind", p.bind, {.help = "its listen address (other than loopback: needs token_file)"});
  s.read("token_file", p.token_file, {.help = "file with the bearer token every scrape must send (docs/metrics.md)"});
  s.finish();
}

void read_trainer(Section s, TrainerSection& t, AsyncSection& async, Section async_training) {
  s.read("total_epochs", t.total_epochs, {.help = "epochs", .minimum = 1});
  s.read("total_training_steps", t.total_training_steps, {.help = "null: epochs x batches", .minimum = 1});
  s.read("balance_batch", t.balance_batch,
         {.help = "reorder rows so data-parallel ranks get equal workloads (Karmarkar-Karp)"});
  s.read("project_name", t.project_name, {.help = "project"});
  s.read("experiment_name", t.experiment_name, {.help = "experiment"});
  s.read(
      "logger", t.logger,
      {.help = "trackers, a list in verl's syntax (['console','jsonl']): console | jsonl | file | tensorboard |"
               " prometheus (docs/tracking.md)"});
  s.read("console_every", t.console_every,
         {.help = "hyflow: the console tracker prints every Nth step (null: 1 on a terminal, 10 into a pipe or "
                  "file); the first, validation and last steps always",
          .minimum = 1});
  s.read("nnodes", t.nnodes, {.help = "nodes", .minimum = 1});
  s.read("n_gpus_per_node", t.n_gpus_per_node, {.help = "workers per node", .minimum = 1});
  s.read("save_freq", t.save_freq, {.help = "save every N steps (-1: never)", .minimum = -1});
  s.read("test_freq", t.test_freq, {.help = "validate every N steps (-1: never)", .minimum = -1});
  s.read("val_before_train", t.val_before_train, {.help = "validate before the first step"});
  s.read("val_only", t.val_only, {.help = "validate and stop"});
  s.read("critic_warmup", t.critic_warmup, {.help = "steps updating only the critic", .minimum = 0});
  s.read("resume_mode", t.resume_mode, {.help = "disable | auto | resume_path"});
  s.read("resume_from_path", t.resume_from_path, {.help = "checkpoint folder global_step_N"});
  s.read("default_local_dir", t.default_local_dir, {.help = "null: checkpoints/{project}/{experiment}"});
  s.read("max_actor_ckpt_to_keep", t.max_actor_ckpt_to_keep, {.help = "null: keep all", .minimum = 1});
  s.read("max_critic_ckpt_to_keep", t.max_critic_ckpt_to_keep, {.help = "null: keep all", .minimum = 1});
  s.read("device", t.device,
         {.help = "cpu | cuda | auto (GPUs when every node has one per worker); workers get cuda:<local rank>"});
  s.read("seed", t.seed, {.help = "controller seed (uids, rollout seeds)"});
  s.read("metrics_file", t.metrics_file,
         {.help = "JSONL metrics of the jsonl tracker (null: {default_local_dir}/metrics.jsonl)"});
  s.read("call_timeout_s", t.call_timeout_s,
         {.help = "fail a worker call not answered within this many seconds, naming the late ranks and their "
                  "workers (0: wait forever)",
          .minimum = 0});
  std::optional<std::vector<nlohmann::json>> profile_steps;
  s.read("profile_steps", profile_steps,
         {.help = "global steps whose step timeline (Chrome trace JSON) is written to "
                  "{default_local_dir}/timeline/step_N.trace.json, e.g. [2,5] (null or []: none; docs/profiling.md)"});
  read_async(s.sub("v1"), async_training, async);
  read_prometheus(s.sub("prometheus"), t.prometheus);
  s.finish();
  if (s.describing()) return;
  for (const auto& step : profile_steps.value_or(std::vector<nlohmann::json>{})) {
    require_config(step.is_number_integer() && step.get<int64_t>() >= 1, s.key_path("profile_steps"),
                   "a list of global steps (integers >= 1) or null", *profile_steps);
    t.profile_steps.push_back(step.get<int64_t>());
  }
  require_one_of(t.resume_mode, {"disable", "auto", "resume_path"}, s.key_path("resume_mode"), t.resume_mode);
  if (t.resume_mode == "resume_path") {
    if (!t.resume_from_path)
      throw ValueError("config key '" + s.key_path("resume_from_path") + "' is required with resume_mode=resume_path");
    require_config(t.resume_from_path->find("global_step_") != std::string::npos, s.key_path("resume_from_path"),
                   "a global_step_N folder", *t.resume_from_path);
  }
  require_one_of(t.device, {"cpu", "cuda", "auto"}, s.key_path("device"), t.device);
  tracking::check_backends(t.logger);  // its messages name trainer.logger
  if (std::find(t.logger.begin(), t.logger.end(), "prometheus") != t.logger.end())
    tracking::check_prometheus_endpoint(t.prometheus);
}

void read_cluster(Section s, ClusterSection& c) {
  s.read("nodes", c.nodes,
         {.help = "caf-node addresses host:port,... (null: workers run in this process); trainer.nnodes of them are "
                  "used"});
  s.read("secret_file", c.secret_file, {.help = "file with the secret the nodes were started with"});
  s.read("heartbeat_ms", c.heartbeat_ms,
         {.help = "middleman heartbeat interval, as the nodes' --heartbeat-ms (0: off)", .minimum = 0});
  s.read("connection_timeout_ms", c.connection_timeout_ms,
         {.help = "drop a node silent this long, as the nodes' --connection-timeout-ms (0: never)", .minimum = 0});
  s.read("tls_cert", c.tls_cert, {.help = "mutual TLS: this controller's certificate (PEM)"});
  s.read("tls_key", c.tls_key, {.help = "mutual TLS: its private key (PEM)"});
  s.read("tls_ca", c.tls_ca, {.help = "mutual TLS: the CA that signed the nodes' certificates (PEM)"});
  s.read("data_plane_bind", c.data_plane_bind,
         {.help = "listen address of this controller's data server for large DataProtos (null: "
                  "HYFLOW_DATA_PLANE_BIND or 127.0.0.1)"});
  s.read("data_plane_host", c.data_plane_host,
         {.help = "address nodes use to reach that server (null: HYFLOW_DATA_PLANE_HOST, else the bind address or "
                  "host name)"});
  s.finish();
}

/// reward_model's trainer keys (the rest of the section is the reward model worker's) and
/// custom_reward_function.
void read_reward(Section rm, Section custom, RewardSection& r) {
  rm.read("enable", r.enable, {.help = "score with a reward model worker"});
  rm.read("reward_manager", r.reward_manager, {.help = "naive | dapo | batch"});
  Section o = rm.sub("overlong_buffer");
  o.read("enable", r.overlong_buffer_enable, {.help = "dapo: overlong penalty"});
  o.read("len", r.overlong_buffer_len, {.help = "dapo: buffer length", .minimum = 0});
  o.read("penalty_factor", r.overlong_buffer_penalty_factor, {.help = "dapo: penalty factor", .minimum = 0});
  o.finish();
  custom.read("path", r.custom_function_path,
              {.help = "shared library whose static initializers register reward functions (null: built-in ones "
                       "only)"});
  custom.read("name", r.custom_function_name,
              {.help = "registered reward function (compute_score without a path: the default router)"});
  custom.finish();
  if (rm.describing()) return;
  require_one_of(r.reward_manager, {"naive", "dapo", "batch"}, rm.key_path("reward_manager"), r.reward_manager);
}

/// Every trainer section of `tree` (describe mode when `keys` is given).
void read_sections(const Json& tree, PPOConfig& c, std::vector<ConfigKey>* keys) {
  Section root(tree, "", keys);
  read_data(root.sub("data"), c.data);
  read_actor_rollout_ref_keys(root.sub("actor_rollout_ref"), c.async);
  read_trainer(root.sub("trainer"), c.trainer, c.async, root.sub("async_training"));
  root.sub("critic").read("enable", c.critic_enable, {.help = "null: on for gae"});
  read_reward(root.sub("reward_model"), root.sub("custom_reward_function"), c.reward);
  read_algorithm(root.sub("algorithm"), c.algorithm);
  read_cluster(root.sub("cluster"), c.cluster);
}

[[noreturn]] void conflict(const std::string& key, const std::string& why) {
  throw ValueError("config key '" + key + "' " + why);
}

/// The rules that span sections (the per-key ones run in the readers).
void check_across(const PPOConfig& c) {
  const auto& d = c.data;
  const auto& a = c.async;
  const int64_t n = c.rollout_n(), world = c.trainer.world_size();
  if ((d.train_batch_size * n) % world != 0)
    conflict("data.train_batch_size", "x rollout.n = " + std::to_string(d.train_batch_size * n) +
                                          " must be divisible by the " + std::to_string(world) +
                                          " workers (trainer.nnodes x trainer.n_gpus_per_node)");
  const auto& fg = c.algorithm.filter_groups;
  if (!fg.enable && d.gen_batch_size && *d.gen_batch_size != d.train_batch_size)
    conflict("data.gen_batch_size", "(" + std::to_string(*d.gen_batch_size) + ") differs from data.train_batch_size (" +
                                        std::to_string(d.train_batch_size) +
                                        ") without algorithm.filter_groups.enable: a step then trains on one "
                                        "generation batch");
  if (fg.enable) {
    if (!fg.metric)
      conflict("algorithm.filter_groups.metric",
               "is required with algorithm.filter_groups.enable (acc, score, seq_reward, seq_final_reward or another "
               "reward_extra_info column)");
    if (*fg.metric == "seq_final_reward" && c.algorithm.use_kl_in_reward)
      conflict("algorithm.filter_groups.metric",
               "= seq_final_reward with algorithm.use_kl_in_reward: the KL-penalized rewards are computed after "
               "filtering here; use seq_reward");
  }
  if (a.enabled()) {
    if (c.algorithm.adv_estimator == "remax")
      conflict("trainer.v1.trainer_mode", "= " + a.trainer_mode +
                                              " with algorithm.adv_estimator=remax: the greedy baselines would come "
                                              "from another weight version than the samples");
    if (a.partial_rollout && a.colocate())
      conflict("async_training.partial_rollout",
               "with trainer.v1.trainer_mode=colocate_async: the colocated actor updates its weights between whole "
               "generation batches; use separate_async");
    if (a.partial_rollout && a.partial_rollout_segments > d.max_response_length)
      conflict("async_training.partial_rollout_segments", "(" + std::to_string(a.partial_rollout_segments) +
                                                              ") exceeds data.max_response_length (" +
                                                              std::to_string(d.max_response_length) + ")");
  }
  // Under wait the batch a step needs must be launchable: on the last step before a sync its
  // weights are parameter_sync_step - 1 versions behind the trainer already.
  if (a.separate() && a.max_off_policy_strategy == "wait" && a.parameter_sync_step - 1 > a.max_off_policy_threshold)
    conflict("trainer.v1.separate_async.parameter_sync_step",
             "(" + std::to_string(a.parameter_sync_step) +
                 ") - 1 exceeds trainer.v1.sampler.max_off_policy_threshold (" +
                 std::to_string(a.max_off_policy_threshold) +
                 ") under the wait strategy: the rollout weights would lag more than the bound before each sync");
  const auto& rc = c.algorithm.rollout_correction;
  const Json& rollout = c.actor_rollout_ref.value("rollout", Json::object());
  // A bf16 rollout samples from another distribution than the float32 actor trains: its mismatch is
  // measured every step (training/rollout_probs_diff_*, the engine's own log-probs; docs/inference.md).
  const Json rollout_dtype = rollout.value("dtype", Json("float32"));
  if (rollout_dtype.is_string() && (rollout_dtype == "bfloat16" || rollout_dtype == "bf16") &&
      !rollout.value("calculate_log_probs", false))
    conflict("actor_rollout_ref.rollout.dtype",
             "(bfloat16) needs the rollout's log-probs to measure and correct its mismatch with the actor: set "
             "actor_rollout_ref.rollout.calculate_log_probs=true");
  if ((rc.corrects() || rc.bypass_mode) && !rollout.value("calculate_log_probs", false)) {
    const char* named = rc.bypass_mode  ? "bypass_mode"
                        : rc.rollout_is ? "rollout_is"
                        : rc.rollout_rs ? "rollout_rs"
                                        : "rollout_token_veto_threshold";
    conflict(std::string("algorithm.rollout_correction.") + named,
             "needs the rollout's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=true");
  }
}

}  // namespace

std::string TrainerSection::local_dir() const {
  return default_local_dir.value_or("checkpoints/" + project_name + "/" + experiment_name);
}

int64_t PPOConfig::rollout_n() const {
  const Json& rollout = actor_rollout_ref.value("rollout", Json::object());
  return rollout.contains("n") && rollout.at("n").is_number_integer() ? rollout.at("n").get<int64_t>() : 1;
}

PPOConfig read_ppo_config(const Config& config) {
  PPOConfig c;
  read_sections(config.tree(), c, nullptr);
  c.actor_rollout_ref = config.subtree("actor_rollout_ref");
  c.critic = config.subtree("critic");
  c.reward_model = config.subtree("reward_model");
  // The workers' own checks first (rollout.n among them), on the subtrees as they will get them.
  // The schedule length needs the data: until it is known, the fewest steps the run can take
  // (one generation batch per epoch) stands in; the exact subtrees are parsed again before launch.
  const int64_t fewest_steps = c.trainer.total_training_steps.value_or(c.trainer.total_epochs);
  for (const RoleSpec& role : ppo_roles(c, fewest_steps))
    if (role.enabled) check_role_config(role);
  check_across(c);
  return c;
}

std::vector<ConfigKey> ppo_trainer_config_keys() {
  std::vector<ConfigKey> keys;
  PPOConfig c;
  read_sections(Json::object(), c, &keys);
  return keys;
}

}  // namespace hyflow::trainer
