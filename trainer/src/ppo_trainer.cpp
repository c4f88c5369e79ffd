// PPOTrainer: verl's fit() step order over the role groups (see docs/trainer.md). What is not the
// step order lives beside it: the config sections (ppo_config.cpp), the role table
// (worker_roles.cpp), placement (placement.cpp), the asynchronous generation pipeline
// (async_pipeline.cpp), the data position (data_cursor.cpp), the checkpoint folders
// (trainer_checkpoint.cpp), the run folder's record (run_folder.cpp) and the trackers
// (hyflow/tracking).
#include <hyflow/actors/call_trace.hpp>
#include <hyflow/agents/agent_rollout.hpp>
#include <hyflow/algos/core_algos.hpp>
#include <hyflow/algos/metric_utils.hpp>
#include <hyflow/algos/rollout_correction.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/metrics/server.hpp>
#include <hyflow/rollout/server_rollout.hpp>
#include <hyflow/tracking/tracking.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/dynamic_sampling.hpp>
#include <hyflow/trainer/placement.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>
#include <hyflow/trainer/reward_manager.hpp>
#include <hyflow/trainer/run_folder.hpp>
#include <hyflow/workers/all.hpp>

#include "async_pipeline.hpp"
#include "data_cursor.hpp"
#include "external_agent_rollout.hpp"
#include "trainer_checkpoint.hpp"
#include "trainer_metrics.hpp"
#include "validation.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>

namespace hyflow::trainer {

namespace fs = std::filesystem;
namespace rc = algos::rollout_correction;
using workers::ActorRolloutRefWorker;
using workers::CriticWorker;
using workers::RewardModelWorker;

struct PPOTrainer::Impl {
  Config config;     // with each key's source, for the run folder
  Json config_tree;  // the resolved config, as trackers log it
  PPOConfig cfg;
  int64_t n = 1, world = 1, total_steps = 0;
  bool multi_turn = false;  // actor_rollout_ref.rollout.multi_turn.enable: the rollout runs agent loops
  algos::core_algos::AlgoConfig algo;
  std::unique_ptr<algos::core_algos::KLController> kl_ctrl;
  rc::RolloutCorrection correction;  // algorithm.rollout_correction

  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
  std::unique_ptr<RLDataset> train_data, val_data;
  std::unique_ptr<DataCursor> data;
  std::unique_ptr<RewardManager> reward_fn, val_reward_fn;

  std::unique_ptr<actors::CallTrace> timeline;  // trainer.profile_steps; before placement: outlives the workers
  std::unique_ptr<Placement> placement;  // before the pipeline: destroyed after it
  WorkerGroup* actor = nullptr;
  WorkerGroup* critic = nullptr;
  WorkerGroup* rm = nullptr;
  std::unique_ptr<AsyncPipeline> pipeline;  // trainer.v1 colocate_async / separate_async
  // rollout.name=server: the router in front of every rollout rank's server (destroyed first)
  std::unique_ptr<rollout::RolloutRouter> rollout_router;
  std::unique_ptr<ExternalAgentRollout> external_agent;  // rollout.agent.external_command: a black-box agent
  std::vector<nlohmann::json> history;

  explicit Impl(const Config& c) : config(c), config_tree(c.tree()), cfg(read_ppo_config(c)) {}
  void setup();
  void start_rollout_router(const std::vector<std::string>& servers);
  std::pair<DataProto, DataProto> prepare_generation(const std::vector<int64_t>& indices,
                                                     const std::string& uid_prefix);
  DataProto with_rollout(DataProto batch, const DataProto& gen_out);
  DataProto generate(const std::vector<int64_t>& indices, const std::string& uid_prefix, nlohmann::json& m);
  void balance_and_count(DataProto& batch, nlohmann::json& m);
  void score(DataProto& batch, nlohmann::json& m);
  std::optional<nlohmann::json> step(int64_t global_step);
  std::optional<nlohmann::json> dynamic_step(int64_t global_step);
  std::optional<nlohmann::json> async_step(int64_t global_step);
  nlohmann::json train(DataProto& batch, int64_t global_step, int64_t epoch, nlohmann::json m,
                       std::chrono::steady_clock::time_point step_start);
  nlohmann::json validate() {
    const Json& val_kwargs = cfg.actor_rollout_ref.at("rollout").value("val_kwargs", Json::object());
    return validate_policy(*actor, *val_data, *val_reward_fn,
                           {.n = val_kwargs.value("n", int64_t{1}),
                            .do_sample = val_kwargs.value("do_sample", false),
                            .batch_size = cfg.data.val_batch_size,
                            .world = world,
                            .multi_turn = multi_turn});
  }
  void save_checkpoint(int64_t global_step);
  int64_t load_checkpoint();
};

void PPOTrainer::Impl::setup() {
  const auto& d = cfg.data;
  n = cfg.rollout_n();
  world = cfg.trainer.world_size();
  multi_turn = agents::parse_multi_turn_config(cfg.actor_rollout_ref.at("rollout")).enable;
  const auto& a = cfg.algorithm;
  algo = {.gamma = a.gamma,
          .lam = a.lam,
          .adv_estimator = a.adv_estimator,
          .norm_adv_by_std_in_grpo = a.norm_adv_by_std_in_grpo,
          .use_kl_in_reward = a.use_kl_in_reward,
          .kl_penalty = a.kl_penalty,
          .kl_ctrl = {.type = a.kl_ctrl.type,
                      .kl_coef = a.kl_ctrl.kl_coef,
                      .horizon = static_cast<double>(a.kl_ctrl.horizon),
                      .target_kl = a.kl_ctrl.target_kl}};
  if (a.use_kl_in_reward) kl_ctrl = algos::core_algos::get_kl_controller(algo.kl_ctrl);
  const auto& c = a.rollout_correction;
  if (c.rollout_is)
    correction.is = rc::RolloutIsOptions{
        .level = *c.rollout_is, .threshold = c.rollout_is_threshold, .batch_normalize = c.rollout_is_batch_normalize};
  if (c.rollout_rs) {
    correction.rs = rc::RolloutRsOptions{.level = *c.rollout_rs, .threshold = *c.rollout_rs_threshold};
    correction.rs->threshold_lower = c.rollout_rs_threshold_lower;
  }
  correction.token_veto_threshold = c.rollout_token_veto_threshold;
  const std::string compute_score = load_custom_reward_function(cfg.reward);

  tokenizer = load_tokenizer(cfg.actor_rollout_ref.at("model").value("path", ""));
  RLDatasetOptions dopt{.max_prompt_length = d.max_prompt_length,
                        .truncation = d.truncation,
                        .filter_overlong_prompts = d.filter_overlong_prompts};
  SyntheticTask task{.task = d.synthetic.task,
                     .size = d.synthetic.train_size,
                     .max_operand = d.synthetic.max_operand,
                     .seed = static_cast<uint64_t>(d.synthetic.seed)};
  train_data = std::make_unique<RLDataset>(load_samples(d.train_files, task, d.prompt_key), tokenizer, dopt);
  SyntheticTask val_task = task;
  val_task.size = d.synthetic.val_size;
  val_task.seed = task.seed + 7919;
  val_task.held_out = true;  // a different draw than the training set
  val_data = std::make_unique<RLDataset>(load_samples(d.val_files, val_task, d.prompt_key), tokenizer, dopt);
  if (d.train_batch_size > train_data->size())
    throw ValueError("config key 'data.train_batch_size' (" + std::to_string(d.train_batch_size) +
                     ") exceeds the training set (" + std::to_string(train_data->size()) + " rows)");
  const auto& t = cfg.trainer;
  data = std::make_unique<DataCursor>(train_data->size(), d.gen_batch_size.value_or(d.train_batch_size), d.shuffle,
                                      static_cast<uint64_t>(d.seed.value_or(1)),
                                      t.total_training_steps ? std::nullopt : std::optional<int64_t>(t.total_epochs));
  total_steps = t.total_training_steps.value_or(data->batches_per_epoch() * t.total_epochs);  // verl: len(dataloader)

  RewardManagerOptions ropt{.name = cfg.reward.reward_manager,
                            .compute_score = compute_score,
                            .num_examine = 0,
                            .max_response_length = d.max_response_length,
                            .overlong_buffer = {.enable = cfg.reward.overlong_buffer_enable,
                                                .len = cfg.reward.overlong_buffer_len,
                                                .penalty_factor = cfg.reward.overlong_buffer_penalty_factor}};
  reward_fn = std::make_unique<RewardManager>(tokenizer, ropt);
  ropt.num_examine = 1;
  val_reward_fn = std::make_unique<RewardManager>(tokenizer, ropt);

  const Json& rollout_section = cfg.actor_rollout_ref.at("rollout");
  if (auto external = agents::parse_external_agent_config(rollout_section); external.enabled()) {
    const std::string key = "config key 'actor_rollout_ref.rollout.agent.external_command'";
    if (rollout_section.value("name", std::string("hf")) != "server")
      throw ValueError(key + " needs actor_rollout_ref.rollout.name=server (the agent calls the rollout servers)");
    if (cfg.async.enabled() || multi_turn || algo.adv_estimator == "remax")
      throw ValueError(key + " does not combine with the asynchronous trainer, multi_turn.enable or remax");
    const auto server = rollout::server_rollout_options(rollout_section);
    external_agent = std::make_unique<ExternalAgentRollout>(
        std::move(external), server.token_file.empty() ? "" : metrics::read_token_file(server.token_file),
        t.local_dir(), tokenizer->pad_token_id(), world);
  }
  if (!t.profile_steps.empty()) timeline = std::make_unique<actors::CallTrace>();
  placement = std::make_unique<Placement>(ppo_roles(cfg, total_steps), ppo_pools(cfg), cfg.trainer, cfg.cluster);
  actor = &placement->group("actor_rollout_ref");
  critic = placement->find("critic");
  rm = placement->find("rm");
  if (cfg.async.enabled())
    pipeline = std::make_unique<AsyncPipeline>(
        cfg.async, d.max_response_length, total_steps, *data,
        [this](const std::vector<int64_t>& rows, const std::string& uid) { return prepare_generation(rows, uid); },
        *actor, placement->find("rollout"));
}

std::pair<DataProto, DataProto> PPOTrainer::Impl::prepare_generation(const std::vector<int64_t>& indices,
                                                                     const std::string& uid_prefix) {
  DataProto batch = train_data->batch(indices);
  dataproto::Column uid;
  for (size_t i = 0; i < indices.size(); ++i) uid.emplace_back(uid_prefix + std::to_string(i));
  batch.non_tensor_batch["uid"] = std::move(uid);
  DataProto gen_batch = batch.pop({"input_ids", "attention_mask", "position_ids"});
  // Agent loops render the conversation themselves (verl hands them the raw chat and the row's kwargs)
  if (multi_turn) agents::copy_agent_columns(batch, gen_batch);
  gen_batch = gen_batch.repeat(n, /*interleave=*/true);
  return {std::move(batch), std::move(gen_batch)};
}

DataProto PPOTrainer::Impl::with_rollout(DataProto batch, const DataProto& gen_out) {
  DataProto rollout = gen_out;  // the handoff figures are per generation call, not per row
  for (const char* key : {"timing", "reshard_peak_extra_bytes"}) rollout.meta_info.erase(key);
  batch.union_with(rollout);
  const int64_t T = batch.batch.at("responses").size(1);
  if (!batch.batch.contains("response_mask"))
    batch.batch.set("response_mask", batch.batch.at("attention_mask").narrow(1, -T, T));
  return batch;
}

/// Prompts -> uid -> rollout.n samples each -> response_mask (ReMax: greedy baselines).
DataProto PPOTrainer::Impl::generate(const std::vector<int64_t>& indices, const std::string& uid_prefix,
                                     nlohmann::json& m) {
  actors::TraceSpan prepare_span("phase", "prepare_batch");  // timeline only, as the other untimed parts
  auto [batch, gen_batch] = prepare_generation(indices, uid_prefix);
  prepare_span.end();
  if (external_agent) {  // the black-box agent's sessions are the rollout (docs/agents-tools.md)
    if (!rollout_router) throw ValueError("a black-box agent needs the rollout router: call init_workers first");
    Timer t(m, "gen");
    return external_agent->generate(*actor, rollout_router->base_url(), batch, n, uid_prefix, m);
  }
  DataProto gen_out;
  {
    Timer t(m, "gen");
    gen_out = actor->call(&ActorRolloutRefWorker::generate_sequences, gen_batch);
  }
  actors::TraceSpan repeat_span("phase", "repeat_batch");
  record_rollout_handoff(gen_out.meta_info, m);
  if (multi_turn) m.update(agents::agent_batch_metrics(gen_out));
  batch = batch.repeat(n, /*interleave=*/true);
  repeat_span.end();
  std::optional<at::Tensor> reward_baselines;
  if (algo.adv_estimator == "remax") {
    Timer t(m, "gen_max");
    DataProto greedy_in = gen_batch;
    greedy_in.meta_info["do_sample"] = false;
    DataProto greedy = actor->call(&ActorRolloutRefWorker::generate_sequences, greedy_in);
    greedy.union_with(batch);
    reward_baselines = (*reward_fn)(greedy).reward_tensor.sum(-1);
  }
  actors::TraceSpan union_span("phase", "union_rollout");
  batch = with_rollout(std::move(batch), gen_out);
  if (reward_baselines) batch.batch.set("reward_baselines", *reward_baselines);
  return batch;
}

void PPOTrainer::Impl::balance_and_count(DataProto& batch, nlohmann::json& m) {
  actors::TraceSpan span("phase", "balance_batch");
  if (cfg.trainer.balance_batch) balance_batch(batch, world, m);
  const auto seq_tokens = batch.batch.at("attention_mask").sum(-1);
  batch.meta_info["global_token_num"] =
      std::vector<int64_t>(seq_tokens.data_ptr<int64_t>(), seq_tokens.data_ptr<int64_t>() + seq_tokens.numel());
}

void PPOTrainer::Impl::score(DataProto& batch, nlohmann::json& m) {
  Timer t(m, "reward");
  if (rm) batch.union_with(DataProto(rm->call(&RewardModelWorker::compute_rm_score, batch)));
  RewardOutput r = (*reward_fn)(batch);
  if (external_agent) external_agent->apply_agent_rewards(batch, r.reward_tensor, m);
  batch.batch.set("token_level_scores", r.reward_tensor);
  for (auto& [k, v] : r.reward_extra_info)
    if (static_cast<int64_t>(v.size()) == batch.size())
      batch.non_tensor_batch[k] = dataproto::Column(v.begin(), v.end());
}

/// One step of the plain loop: one generation batch of train_batch_size prompts.
std::optional<nlohmann::json> PPOTrainer::Impl::step(int64_t global_step) {
  nlohmann::json m = nlohmann::json::object();
  const auto step_start = std::chrono::steady_clock::now();
  int64_t epoch = 0;
  const auto indices = data->next(epoch);
  if (!indices) return std::nullopt;
  DataProto batch = generate(*indices, "s" + std::to_string(global_step) + "-", m);
  balance_and_count(batch, m);
  score(batch, m);
  return train(batch, global_step, epoch, std::move(m), step_start);
}

/// One step with dynamic sampling; nullopt when the data ran out before the batch was full.
std::optional<nlohmann::json> PPOTrainer::Impl::dynamic_step(int64_t global_step) {
  nlohmann::json m = nlohmann::json::object();
  const auto step_start = std::chrono::steady_clock::now();
  const auto& fg = cfg.algorithm.filter_groups;
  DynamicSampler sampler(cfg.data.train_batch_size, n, fg.max_num_gen_batches);
  int64_t epoch = 0;
  while (!sampler.full()) {
    const auto indices = data->next(epoch);
    if (!indices) return std::nullopt;
    // rows are filtered and trimmed by prompt group before balancing, which reorders them
    DataProto batch = generate(
        *indices, "s" + std::to_string(global_step) + "-g" + std::to_string(sampler.num_gen_batches()) + "-", m);
    score(batch, m);
    sampler.add(batch, filter_metric_values(batch, *fg.metric));
  }
  m["train/num_gen_batches"] = sampler.num_gen_batches();
  DataProto batch = sampler.take();
  balance_and_count(batch, m);
  return train(batch, global_step, epoch, std::move(m), step_start);
}

/// One step of the asynchronous modes: batches generated ahead, stale ones dropped.
std::optional<nlohmann::json> PPOTrainer::Impl::async_step(int64_t global_step) {
  nlohmann::json m = nlohmann::json::object();
  const auto step_start = std::chrono::steady_clock::now();
  const auto& fg = cfg.algorithm.filter_groups;
  std::optional<DynamicSampler> sampler;
  if (fg.enable) sampler.emplace(cfg.data.train_batch_size, n, fg.max_num_gen_batches);
  AsyncPipeline::StepCounts counts;
  int64_t epoch = 0;
  DataProto batch;
  for (;;) {
    auto generated = pipeline->next(global_step, m, counts);
    if (!generated) return std::nullopt;  // the data of total_epochs ran out
    epoch = generated->epoch;
    DataProto rows = with_rollout(generated->prompts.repeat(n, /*interleave=*/true), generated->output);
    score(rows, m);
    if (!sampler) {
      batch = std::move(rows);
      break;
    }
    sampler->add(rows, filter_metric_values(rows, *fg.metric));
    if (sampler->full()) {
      m["train/num_gen_batches"] = sampler->num_gen_batches();
      batch = sampler->take();
      break;
    }
  }
  // separate_async: the next batches generate while this one trains
  if (cfg.async.separate()) pipeline->top_up(global_step, /*popped_this_step=*/true);
  m["training/off_policy/dropped_trajectories"] = counts.dropped_rows;
  if (pipeline->requeues()) {
    m["training/off_policy/requeued_groups"] = counts.requeued_groups;
    m["training/off_policy/replay_buffer_groups"] = pipeline->replay_buffer_groups();
  }
  m.update(off_policy_metrics(batch, global_step - 1));
  balance_and_count(batch, m);
  return train(batch, global_step, epoch, std::move(m), step_start);
}

/// old/ref log-probs, values, advantages, the updates and the step's metrics.
nlohmann::json PPOTrainer::Impl::train(DataProto& batch, int64_t global_step, int64_t epoch, nlohmann::json m,
                                       std::chrono::steady_clock::time_point step_start) {
  const bool use_kl = algo.use_kl_in_reward || cfg.actor_rollout_ref.at("actor").value("use_kl_loss", false);
  const std::string loss_agg_mode = cfg.actor_rollout_ref.at("actor").value("loss_agg_mode", "token-mean");
  if (cfg.algorithm.rollout_correction.bypass_mode) {  // verl's bypass: the rollout's log-probs are the old policy
    batch.batch.set("old_log_probs", batch.batch.at("rollout_log_probs"));
  } else {
    Timer t(m, "old_log_prob");
    DataProto old = actor->call(&ActorRolloutRefWorker::compute_log_prob, batch);
    const at::Tensor entropys = old.batch.pop("entropys");
    m["actor/entropy"] =
        algos::core_algos::agg_loss(entropys, batch.batch.at("response_mask"), loss_agg_mode).item<double>();
    batch.union_with(
        old.select(std::vector<std::string>{"old_log_probs"}, std::vector<std::string>{}, std::vector<std::string>{}));
    // verl's debug metric: how far the rollout's probabilities of the sampled tokens are from the
    // actor's (computed whenever the rollout returned its log-probs)
    if (batch.batch.contains("rollout_log_probs")) m.update(rollout_probs_diff_metrics(batch));
  }
  {
    actors::TraceSpan span("phase", "rollout_correction");
    m.update(rc::apply_rollout_correction(batch, correction));
  }
  if (use_kl) {
    Timer t(m, "ref");
    DataProto ref = actor->call(&ActorRolloutRefWorker::compute_ref_log_prob, batch);
    batch.union_with(
        ref.select(std::vector<std::string>{"ref_log_prob"}, std::vector<std::string>{}, std::vector<std::string>{}));
  }
  if (critic) {
    Timer t(m, "values");
    DataProto v = critic->call(&CriticWorker::compute_values, batch);
    batch.union_with(
        v.select(std::vector<std::string>{"values"}, std::vector<std::string>{}, std::vector<std::string>{}));
  }
  {
    Timer t(m, "adv");
    if (algo.use_kl_in_reward) {
      for (const auto& [k, v] : algos::core_algos::apply_kl_penalty(batch, *kl_ctrl, algo.kl_penalty)) m[k] = v;
    } else {
      batch.batch.set("token_level_rewards", batch.batch.at("token_level_scores"));
    }
    algos::core_algos::AdvantageInputs in;
    in.token_level_rewards = batch.batch.at("token_level_rewards");
    in.response_mask = batch.batch.at("response_mask");
    if (batch.batch.contains("values")) in.values = batch.batch.at("values");
    std::vector<std::string> index;
    for (const auto& u : batch.non_tensor_batch.at("uid")) index.push_back(u.get<std::string>());
    in.index = std::move(index);
    if (batch.batch.contains("reward_baselines")) in.reward_baselines = batch.batch.at("reward_baselines");
    in.old_log_probs = batch.batch.at("old_log_probs");
    in.config = algo;
    auto out = algos::core_algos::get_adv_estimator_fn(algo.adv_estimator)(in);
    batch.batch.set("advantages", out.advantages);
    batch.batch.set("returns", out.returns);
  }
  if (critic) {
    Timer t(m, "update_critic");
    DataProto out = critic->call(&CriticWorker::update_critic, batch);
    for (const auto& [k, v] : algos::metric_utils::reduce_metrics(out.meta_info.at("metrics"))) m[k] = v;
  }
  if (cfg.trainer.critic_warmup <= global_step) {
    Timer t(m, "update_actor");
    DataProto out = actor->call(&ActorRolloutRefWorker::update_actor, batch);
    for (const auto& [k, v] : algos::metric_utils::reduce_metrics(out.meta_info.at("metrics"))) m[k] = v;
  }
  if (pipeline) pipeline->after_actor_update(global_step, m);  // the weights the next batches generate on
  const auto step_end = std::chrono::steady_clock::now();
  m["timing_s/step"] = std::chrono::duration<double>(step_end - step_start).count();
  if (auto* trace = actors::CallTrace::active()) trace->add("step", "step", step_start, step_end);
  std::map<std::string, double> timing_raw;
  for (const auto& [k, v] : m.items())
    if (k.rfind("timing_s/", 0) == 0) timing_raw[k.substr(9)] = v.get<double>();
  const int64_t workers =
      world + (cfg.async.separate() ? cfg.async.rollout_nnodes * cfg.async.rollout_n_gpus_per_node : 0);
  m.update(algos::metric_utils::compute_data_metrics(batch, critic != nullptr));
  m.update(algos::metric_utils::compute_timing_metrics(batch, timing_raw));
  m.update(algos::metric_utils::compute_throughout_metrics(batch, timing_raw, workers));
  m["training/global_step"] = global_step;
  m["training/epoch"] = epoch;
  return m;
}

void PPOTrainer::Impl::save_checkpoint(int64_t global_step) {
  // async modes: the batches still generating are not consumed; a resumed run generates them again
  nlohmann::json state = {{"global_step", global_step},
                          {"data_cursor", pipeline ? pipeline->consumed_position() : data->position()},
                          {"gen_batch_size", data->gen_batch_size()}};
  if (kl_ctrl) state["kl_coef"] = kl_ctrl->value;
  if (pipeline && pipeline->requeues()) state["replay_buffer"] = pipeline->replay_buffer_state();
  std::optional<int64_t> keep;
  for (const auto& k : {cfg.trainer.max_actor_ckpt_to_keep, cfg.trainer.max_critic_ckpt_to_keep})
    if (k) keep = keep ? std::min(*keep, *k) : *k;
  auto write_roles = [&](const fs::path& dir) {
    actor->call(&ActorRolloutRefWorker::save_checkpoint, (dir / "actor").string(), global_step);
    if (critic) critic->call(&CriticWorker::save_checkpoint, (dir / "critic").string(), global_step);
  };
  save_checkpoint_folder(cfg.trainer.local_dir(), global_step, write_roles, state, keep);
}

// The router the outside agents call (same host and token rules as the rollout servers), its URL
// logged and written to {default_local_dir}/rollout_server.json.
void PPOTrainer::Impl::start_rollout_router(const std::vector<std::string>& servers) {
  rollout_router = std::make_unique<rollout::RolloutRouter>(
      servers, rollout::server_rollout_options(cfg.actor_rollout_ref.at("rollout")));
  const fs::path dir(cfg.trainer.local_dir());
  fs::create_directories(dir);
  const nlohmann::json record{{"base_url", rollout_router->base_url()}, {"replicas", servers}};
  std::ofstream(dir / "rollout_server.json.tmp") << record.dump(2) << "\n";
  fs::rename(dir / "rollout_server.json.tmp", dir / "rollout_server.json");
  std::cout << "rollout server: router at " << rollout_router->base_url() << " over " << servers.size()
            << " replica(s); written to " << (dir / "rollout_server.json").string() << std::endl;
}

int64_t PPOTrainer::Impl::load_checkpoint() {
  const auto& t = cfg.trainer;
  data->seek(0);
  const auto dir = resume_folder(t.resume_mode, t.local_dir(), t.resume_from_path);
  if (!dir) return 0;
  const int64_t step = checkpoint_step(*dir);
  actor->call(&ActorRolloutRefWorker::load_checkpoint, (*dir / "actor").string());
  if (critic) critic->call(&CriticWorker::load_checkpoint, (*dir / "critic").string());
  const fs::path file = *dir / "data.json";
  const nlohmann::json state = read_trainer_state(file, step);
  // data position: older checkpoints (plain loop, one generation batch per step) lack it
  int64_t position = step;
  if (state.contains("data_cursor")) {
    if (!state.at("data_cursor").is_number_integer() || state.at("data_cursor").get<int64_t>() < step)
      throw FormatError(file.string() + ": data_cursor " + state.at("data_cursor").dump() +
                        " is not an integer >= global_step " + std::to_string(step));
    position = state.at("data_cursor").get<int64_t>();
  }
  data->seek(position);
  if (pipeline) {
    pipeline->set_consumed_position(position);
    pipeline->restore_replay_buffer(state, file, train_data->size());
  }
  if (state.contains("gen_batch_size") && state.at("gen_batch_size") != data->gen_batch_size())
    throw ValueError("config key 'data.gen_batch_size' (" + std::to_string(data->gen_batch_size()) + ") differs from " +
                     state.at("gen_batch_size").dump() + " of the checkpoint " + dir->string() +
                     ": its data position counts generation batches of that size");
  if (kl_ctrl) {
    if (!state.contains("kl_coef") || !state.at("kl_coef").is_number())
      throw FormatError(file.string() + ": no numeric kl_coef (algorithm.use_kl_in_reward is on)");
    kl_ctrl->value = state.at("kl_coef").get<double>();
  }
  std::cout << "resumed from " << dir->string() << " (global step " << step << ")\n";
  return step;
}

PPOTrainer::PPOTrainer(const Config& config) : impl_(std::make_unique<Impl>(config)) {
  impl_->setup();
}
PPOTrainer::~PPOTrainer() = default;

void PPOTrainer::init_workers() {
  std::vector<std::string> servers;  // rollout.name=server: each rollout rank's base_url
  for (const char* role : {"actor_rollout_ref", "rollout"})
    if (WorkerGroup* g = impl_->placement->find(role)) {
      g->call(&ActorRolloutRefWorker::init_model);
      const std::vector<nlohmann::json> stats = g->call(&ActorRolloutRefWorker::decode_stats);
      for (const auto& st : stats)
        if (st.contains("base_url")) servers.push_back(st.at("base_url").get<std::string>());
    }
  if (!servers.empty()) impl_->start_rollout_router(servers);
  if (impl_->critic) impl_->critic->call(&CriticWorker::init_model);
  if (impl_->rm) impl_->rm->call(&RewardModelWorker::init_model);
}

nlohmann::json PPOTrainer::validate() {
  return impl_->validate();
}
const std::vector<nlohmann::json>& PPOTrainer::history() const {
  return impl_->history;
}
int64_t PPOTrainer::total_training_steps() const {
  return impl_->total_steps;
}
std::string PPOTrainer::checkpoint_dir() const {
  return impl_->cfg.trainer.local_dir();
}

void PPOTrainer::fit() {
  Impl& s = *impl_;
  const auto& t = s.cfg.trainer;
  int64_t global_step = s.load_checkpoint();
  write_run_folder(t.local_dir(), s.config, global_step);
  tracking::Tracking tracker(t.logger, {.project_name = t.project_name,
                                        .experiment_name = t.experiment_name,
                                        .local_dir = t.local_dir(),
                                        .metrics_file = t.metrics_file.value_or(t.local_dir() + "/metrics.jsonl"),
                                        .total_steps = s.total_steps,
                                        .resumed_step = global_step,
                                        .console_every = t.console_every.value_or(0),
                                        .prometheus = t.prometheus});
  tracker.log_config(s.config_tree);
  auto log = [&](nlohmann::json metrics, int64_t step) {
    tracker.log(metrics, step);
    metrics["step"] = step;
    s.history.push_back(std::move(metrics));
  };
  if (t.val_before_train && global_step == 0) {
    nlohmann::json m = nlohmann::json::object();
    {
      Timer timer(m, "testing");
      m.update(s.validate());
    }
    log(m, 0);
    if (t.val_only) return tracker.close();
  }
  if (s.pipeline) s.pipeline->start(global_step);
  while (global_step < s.total_steps) {
    // trainer.profile_steps: this step's timeline, from its start to its checkpoint (docs/profiling.md)
    const bool profiled =
        std::find(t.profile_steps.begin(), t.profile_steps.end(), global_step + 1) != t.profile_steps.end();
    struct Recording {
      actors::CallTrace* trace;
      ~Recording() {
        if (trace) trace->stop();
      }
    } recording{profiled ? s.timeline.get() : nullptr};
    if (recording.trace) recording.trace->start();
    std::optional<nlohmann::json> stepped = s.pipeline                             ? s.async_step(global_step + 1)
                                            : s.cfg.algorithm.filter_groups.enable ? s.dynamic_step(global_step + 1)
                                                                                   : s.step(global_step + 1);
    if (!stepped) {
      std::cout << "the training data of trainer.total_epochs ran out at step " << global_step << " of "
                << s.total_steps << "\n";
      break;
    }
    nlohmann::json& m = *stepped;
    ++global_step;
    const bool last = global_step == s.total_steps;
    if (t.test_freq > 0 && (last || global_step % t.test_freq == 0)) {
      Timer timer(m, "testing");
      m.update(s.validate());
    }
    if (t.save_freq > 0 && (last || global_step % t.save_freq == 0)) {
      Timer timer(m, "save_checkpoint");
      s.save_checkpoint(global_step);
    }
    if (recording.trace) {
      recording.trace->stop();
      recording.trace->write(t.local_dir() + "/timeline/step_" + std::to_string(global_step) + ".trace.json");
    }
    log(m, global_step);
  }
  if (s.pipeline) s.pipeline->finish();
  tracker.close();
}

}  // namespace hyflow::trainer
