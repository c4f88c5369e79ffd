// PPOTrainer: verl's fit() step order over colocated worker groups (see docs/trainer.md).
#include <hyflow/actors/all.hpp>
#include <hyflow/cluster/all.hpp>
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>
#include <hyflow/algos/rollout_correction.hpp>
#include <hyflow/trainer/async_rollout.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/dynamic_sampling.hpp>
#include <hyflow/algos/metric_utils.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>
#include <hyflow/trainer/reward_manager.hpp>
#include <hyflow/workers/all.hpp>

#include "trainer_metrics.hpp"

#include <torch/cuda.h>

#include <chrono>
#include <deque>
#include <future>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>

namespace hyflow::trainer {

namespace fs = std::filesystem;
using workers::ActorRolloutRefWorker;
using workers::CriticWorker;
using workers::RewardModelWorker;

namespace {

class Timer {
 public:
  Timer(nlohmann::json& metrics, const std::string& name) : metrics_(metrics), name_(name), start_(clock::now()) {}
  /// Adds to the metric: a step of several generation batches sums their times.
  ~Timer() {
    const double s = std::chrono::duration<double>(clock::now() - start_).count();
    auto& slot = metrics_["timing_s/" + name_];
    slot = slot.is_number() ? slot.get<double>() + s : s;
  }

 private:
  using clock = std::chrono::steady_clock;
  nlohmann::json& metrics_;
  std::string name_;
  clock::time_point start_;
};

void write_text_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) throw Error("cannot write " + tmp.string());
  }
  fs::rename(tmp, path);
}

int64_t step_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  const std::string prefix = "global_step_";
  if (name.rfind(prefix, 0) != 0)
    throw ValueError("checkpoint folder '" + dir.string() + "' is not named global_step_N");
  try {
    size_t used = 0;
    const int64_t n = std::stoll(name.substr(prefix.size()), &used);
    if (used != name.size() - prefix.size()) throw std::invalid_argument(name);
    return n;
  } catch (const std::exception&) {
    throw ValueError("checkpoint folder '" + dir.string() + "' is not named global_step_N");
  }
}

/// The trainer state of a checkpoint (data.json): a JSON object whose global_step is the folder's.
nlohmann::json read_trainer_state(const fs::path& file, int64_t step) {
  std::ifstream in(file);
  if (!in) throw FormatError("checkpoint trainer state " + file.string() + " is missing");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("checkpoint trainer state " + file.string() + " is not valid JSON: " + e.what());
  }
  if (!state.is_object() || !state.contains("global_step") || !state.at("global_step").is_number_integer())
    throw FormatError("checkpoint trainer state " + file.string() + " has no integer global_step");
  if (state.at("global_step").get<int64_t>() != step)
    throw FormatError("checkpoint trainer state " + file.string() + " says global_step " +
                      state.at("global_step").dump() + ", its folder says " + std::to_string(step));
  return state;
}

/// The replay buffer of a checkpoint's trainer state (absent: empty); FormatError naming the file.
template <class Requeued>
std::deque<Requeued> read_replay_buffer_as(const nlohmann::json& state, const fs::path& file) {
  std::deque<Requeued> out;
  if (!state.contains("replay_buffer")) return out;
  const auto& list = state.at("replay_buffer");
  auto bad = [&](size_t i) {
    return FormatError(file.string() + ": replay_buffer[" + std::to_string(i) +
                       "] is not {indices: [int], epoch: int, times: int, origin: string}");
  };
  if (!list.is_array()) throw FormatError(file.string() + ": replay_buffer is not a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& e = list[i];
    if (!e.is_object() || !e.contains("indices") || !e.at("indices").is_array() || !e.contains("epoch") ||
        !e.at("epoch").is_number_integer() || !e.contains("times") || !e.at("times").is_number_integer() ||
        !e.contains("origin") || !e.at("origin").is_string())
      throw bad(i);
    Requeued r;
    for (const auto& index : e.at("indices")) {
      if (!index.is_number_integer()) throw bad(i);
      r.indices.push_back(index.get<int64_t>());
    }
    r.epoch = e.at("epoch").get<int64_t>();
    r.times = e.at("times").get<int64_t>();
    r.origin = e.at("origin").get<std::string>();
    out.push_back(std::move(r));
  }
  return out;
}

/// The first of `<path><suffix>`, `<path><suffix>.1`, ... that does not exist (nothing is overwritten).
fs::path free_path(const fs::path& path, const std::string& suffix) {
  fs::path target = path.string() + suffix;
  for (int n = 1; fs::exists(target); ++n) target = path.string() + suffix + "." + std::to_string(n);
  return target;
}

}  // namespace

struct PPOTrainer::Impl {
  Config config;
  std::string adv_estimator;
  bool use_critic = false;
  bool use_rm = false;
  bool use_kl_in_reward = false;
  bool use_kl_loss = false;
  int64_t n = 1;
  int64_t world = 1;
  int64_t train_batch_size = 0;
  int64_t max_response_length = 0;
  int64_t max_prompt_length = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  // Data position: generation batches of gen_batch_size prompts taken so far, over all epochs
  // (epoch = data_cursor / gen_batches_per_epoch). Without filter_groups a step takes one.
  int64_t gen_batch_size = 0;
  int64_t gen_batches_per_epoch = 0;
  int64_t data_cursor = 0;
  std::optional<int64_t> data_budget;  // generation batches of total_epochs (null total_training_steps)
  bool filter_groups = false;
  std::string filter_metric;
  int64_t max_num_gen_batches = 0;
  int64_t order_epoch = -1;
  std::vector<int64_t> order;
  uint64_t data_seed = 1;
  std::string loss_agg_mode;
  std::string ckpt_root;
  std::string metrics_file;
  algos::core_algos::AlgoConfig algo;
  std::unique_ptr<algos::core_algos::KLController> kl_ctrl;

  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
  std::unique_ptr<RLDataset> train_data, val_data;
  std::unique_ptr<RewardManager> reward_fn, val_reward_fn;

  std::unique_ptr<Runtime> runtime;  // before the groups: destroyed after them (it owns the launcher)
  std::optional<WorkerGroup> bundle;
  std::optional<WorkerGroup> actor, critic, rm;
  std::vector<nlohmann::json> history;

  // algorithm.rollout_correction: IS weights, rejection sampling, the token veto, bypass mode
  std::optional<algos::rollout_correction::RolloutIsOptions> rollout_is;
  std::optional<algos::rollout_correction::RolloutRsOptions> rollout_rs;
  std::optional<double> rollout_token_veto;
  bool bypass_mode = false;
  // trainer.v1.trainer_mode=separate_async: a rollout group of its own, fed versioned weights,
  // generating up to num_warmup_batches generation batches ahead of training (docs/trainer.md);
  // colocate_async: the same batches ahead, generated by the trainer's own actor group
  bool separate_async = false;
  bool colocate_async = false;
  bool async_mode() const { return separate_async || colocate_async; }
  int64_t num_warmup_batches = 1;
  int64_t parameter_sync_step = 1;  // separate_async: publish every N steps
  int64_t generation_version = 0;   // the version a generation batch launched now runs on
  int64_t max_off_policy_threshold = 8;
  bool drop_stale = true;  // max_off_policy_strategy: drop (else wait)
  bool partial_rollout = false;
  int64_t partial_segments = 1;
  int64_t rollout_world = 0;
  int64_t consumed_cursor = 0;  // data_cursor after the last generation batch taken off the queue
  // trainer.v1.sampler.max_requeues: the replay buffer of prompt batches dropped as stale, generated
  // again (before fresh data) on newer weights, each prompt at most max_requeues times
  struct Requeued {
    std::vector<int64_t> indices;  // dataset rows
    int64_t epoch = 0;
    int64_t times = 0;   // how often these prompts were requeued
    std::string origin;  // the uid prefix of their first generation batch
  };
  int64_t max_requeues = 0;
  std::deque<Requeued> requeue;
  std::deque<Requeued> read_replay_buffer(const nlohmann::json& state, const fs::path& file) const {
    auto out = read_replay_buffer_as<Requeued>(state, file);
    for (const auto& r : out)
      for (int64_t index : r.indices)
        if (index < 0 || index >= train_data->size())
          throw FormatError(file.string() + ": replay_buffer row " + std::to_string(index) +
                            " is outside the training set (" + std::to_string(train_data->size()) + " rows)");
    return out;
  }
  struct InFlight {
    DataProto batch;  // the prompts' columns (not repeated), uid set
    int64_t epoch = 0;
    int64_t cursor_after = 0;
    int64_t version = 0;  // generation_version at launch (colocate_async stamps the rows with it)
    std::shared_future<DataProto> result;
    Requeued prompts;  // what the batch holds, to requeue it if it is dropped
  };
  std::deque<InFlight> in_flight;
  std::optional<WorkerGroup> rollout_wg;         // declared after runtime: destroyed before it
  std::unique_ptr<SerialExecutor> executor;  // declared after rollout: joined before it goes

  explicit Impl(const Config& c) : config(c) {}
  ~Impl() { settle_colocated(); }
  /// colocate_async: waits for the generation calls still running on the actor group (a step that
  /// failed, or batches launched ahead of steps that did not come) before the groups go.
  void settle_colocated() {
    if (!colocate_async) return;
    for (auto& item : in_flight)
      if (item.result.valid()) item.result.wait();
    in_flight.clear();
  }
  void setup();
  void setup_rollout_correction();
  /// The rows of the next generation batch (data_cursor advances), with its epoch; nullopt
  /// when the data budget is spent.
  std::optional<std::vector<int64_t>> next_gen_batch(int64_t& epoch);
  /// Prompts -> uid -> rollout.n samples each -> response_mask (ReMax: greedy baselines).
  DataProto generate(const std::vector<int64_t>& indices, const std::string& uid_prefix, nlohmann::json& m);
  /// The prompt batch of `indices` with uids, and its generation input (rollout.n rows per prompt).
  std::pair<DataProto, DataProto> prepare_generation(const std::vector<int64_t>& indices,
                                                     const std::string& uid_prefix);
  /// Prompt rows (already repeated rollout.n times) joined with their rollout, response_mask set.
  DataProto with_rollout(DataProto batch, const DataProto& gen_out);
  // separate_async
  void launch_generation();
  void submit_segment(std::shared_ptr<std::promise<DataProto>> promise, DataProto input, int64_t segment);
  /// Launches generation batches until num_warmup_batches are in flight (with the wait strategy,
  /// only those that cannot lag more than max_off_policy_threshold versions when trained).
  /// `step` is the training step running now.
  void top_up(int64_t step, bool popped_this_step);
  /// Prompt groups requeued and not yet trained: those waiting and those generating again.
  int64_t replay_buffer_groups() const;
  /// The replay buffer as a checkpoint records it (what a resumed run generates before fresh data).
  nlohmann::json replay_buffer_state() const;
  /// colocate_async: the batch's generation as a non-blocking call on the trainer's actor group.
  std::shared_future<DataProto> generate_colocated(DataProto gen_batch);
  /// The weights after the update of `step`: published to the rollout group (separate_async, every
  /// parameter_sync_step steps) or already in the colocated actor.
  void after_actor_update(int64_t step, nlohmann::json& m);
  /// Rollout correction after the old log-probs: IS weights, rejection and veto masks, metrics.
  void rollout_correction(DataProto& batch, nlohmann::json& m);
  void publish_weights(int64_t version);
  std::optional<nlohmann::json> async_step(int64_t global_step);
  void balance_and_count(DataProto& batch, nlohmann::json& m);
  void score(DataProto& batch, nlohmann::json& m);
  /// old/ref log-probs, values, advantages, updates and the step's metrics.
  nlohmann::json train(DataProto& batch, int64_t global_step, int64_t epoch, nlohmann::json m,
                       std::chrono::steady_clock::time_point step_start,
                       const std::function<void(nlohmann::json&)>& after_update = {});
  /// One step of the plain loop: one generation batch of train_batch_size prompts.
  nlohmann::json step(int64_t global_step, int64_t epoch, const std::vector<int64_t>& indices);
  /// One step with dynamic sampling; nullopt when the data ran out before the batch was full.
  std::optional<nlohmann::json> dynamic_step(int64_t global_step);
  nlohmann::json validate();
  void save_checkpoint(int64_t global_step);
  /// Before the first line of this run: see docs/trainer.md, "Metrics file".
  void prepare_metrics_file(int64_t resumed_step);
  int64_t load_checkpoint();
  void log(const nlohmann::json& metrics, int64_t step, bool progress);
};

void PPOTrainer::Impl::setup() {
  const Config& c = config;
  adv_estimator = c.get_string("algorithm.adv_estimator");
  (void)algos::core_algos::get_adv_estimator_fn(adv_estimator);  // KeyError naming it early
  use_critic = c.is_null("critic.enable") ? adv_estimator == "gae" : c.get_bool("critic.enable");
  use_rm = c.get_bool("reward_model.enable");
  use_kl_in_reward = c.get_bool("algorithm.use_kl_in_reward");
  use_kl_loss = c.get_bool("actor_rollout_ref.actor.use_kl_loss");
  n = c.get_int("actor_rollout_ref.rollout.n");
  world = c.get_int("trainer.nnodes") * c.get_int("trainer.n_gpus_per_node");
  train_batch_size = c.get_int("data.train_batch_size");
  max_prompt_length = c.get_int("data.max_prompt_length");
  max_response_length = c.get_int("data.max_response_length");
  data_seed = c.is_null("data.seed") ? 1 : static_cast<uint64_t>(c.get_int("data.seed"));
  loss_agg_mode = c.get_string("actor_rollout_ref.actor.loss_agg_mode");
  if (world <= 0) throw ValueError("config keys 'trainer.nnodes' x 'trainer.n_gpus_per_node' must be > 0");
  if (train_batch_size <= 0) throw ValueError("config key 'data.train_batch_size' must be > 0");
  if ((train_batch_size * n) % world != 0)
    throw ValueError("config key 'data.train_batch_size' x rollout.n = " + std::to_string(train_batch_size * n) +
                     " must be divisible by the " + std::to_string(world) + " workers");
  algo.gamma = c.get_double("algorithm.gamma");
  algo.lam = c.get_double("algorithm.lam");
  algo.adv_estimator = adv_estimator;
  algo.norm_adv_by_std_in_grpo = c.get_bool("algorithm.norm_adv_by_std_in_grpo");
  algo.use_kl_in_reward = use_kl_in_reward;
  algo.kl_penalty = c.get_string("algorithm.kl_penalty");
  algo.kl_ctrl.type = c.get_string("algorithm.kl_ctrl.type");
  algo.kl_ctrl.kl_coef = c.get_double("algorithm.kl_ctrl.kl_coef");
  algo.kl_ctrl.horizon = static_cast<double>(c.get_int("algorithm.kl_ctrl.horizon"));
  algo.kl_ctrl.target_kl = c.get_double("algorithm.kl_ctrl.target_kl");
  if (use_kl_in_reward) kl_ctrl = algos::core_algos::get_kl_controller(algo.kl_ctrl);

  const std::string model_path = c.get_string("actor_rollout_ref.model.path");
  if (model_path.empty()) throw ValueError("config key 'actor_rollout_ref.model.path' is required");
  tokenizer = load_tokenizer(model_path);

  RLDatasetOptions dopt{.max_prompt_length = max_prompt_length,
                        .truncation = c.get_string("data.truncation"),
                        .filter_overlong_prompts = c.get_bool("data.filter_overlong_prompts")};
  SyntheticTask task{.task = c.get_string("data.synthetic.task"),
                     .size = c.get_int("data.synthetic.train_size"),
                     .max_operand = c.get_int("data.synthetic.max_operand"),
                     .seed = static_cast<uint64_t>(c.get_int("data.synthetic.seed"))};
  const std::string prompt_key = c.get_string("data.prompt_key");
  train_data =
      std::make_unique<RLDataset>(load_samples(c.get_string("data.train_files"), task, prompt_key), tokenizer, dopt);
  SyntheticTask val_task = task;
  val_task.size = c.get_int("data.synthetic.val_size");
  val_task.seed = task.seed + 7919;  // a different draw than the training set
  val_data =
      std::make_unique<RLDataset>(load_samples(c.get_string("data.val_files"), val_task, prompt_key), tokenizer, dopt);
  if (train_batch_size > train_data->size())
    throw ValueError("config key 'data.train_batch_size' (" + std::to_string(train_batch_size) +
                     ") exceeds the training set (" + std::to_string(train_data->size()) + " rows)");
  filter_groups = c.get_bool("algorithm.filter_groups.enable");
  gen_batch_size = c.is_null("data.gen_batch_size") ? train_batch_size : c.get_int("data.gen_batch_size");
  if (!filter_groups && gen_batch_size != train_batch_size)
    throw ValueError("config key 'data.gen_batch_size' (" + std::to_string(gen_batch_size) +
                     ") differs from data.train_batch_size (" + std::to_string(train_batch_size) +
                     ") without algorithm.filter_groups.enable: a step then trains on one generation batch");
  if (filter_groups) {
    if (c.is_null("algorithm.filter_groups.metric"))
      throw ValueError("config key 'algorithm.filter_groups.metric' is required with algorithm.filter_groups.enable "
                       "(acc, score, seq_reward, seq_final_reward or another reward_extra_info column)");
    filter_metric = c.get_string("algorithm.filter_groups.metric");
    max_num_gen_batches = c.get_int("algorithm.filter_groups.max_num_gen_batches");
    if (filter_metric == "seq_final_reward" && use_kl_in_reward)
      throw ValueError("config key 'algorithm.filter_groups.metric' = seq_final_reward with "
                       "algorithm.use_kl_in_reward: the KL-penalized rewards are computed after filtering here; "
                       "use seq_reward");
  }
  gen_batches_per_epoch = train_data->size() / gen_batch_size;  // drop_last
  if (gen_batches_per_epoch == 0)
    throw ValueError("config key 'data.gen_batch_size' (" + std::to_string(gen_batch_size) +
                     ") exceeds the training set (" + std::to_string(train_data->size()) + " rows)");
  steps_per_epoch = gen_batches_per_epoch;  // verl: len(train_dataloader)
  if (c.is_null("trainer.total_training_steps")) {
    total_steps = steps_per_epoch * c.get_int("trainer.total_epochs");
    data_budget = gen_batches_per_epoch * c.get_int("trainer.total_epochs");
  } else {
    total_steps = c.get_int("trainer.total_training_steps");
  }

  setup_rollout_correction();
  const std::string mode = c.get_string("trainer.v1.trainer_mode");
  if (mode != "sync" && mode != "separate_async" && mode != "colocate_async")
    throw ValueError("config key 'trainer.v1.trainer_mode': unknown mode '" + mode +
                     "' (sync, colocate_async, separate_async)");
  separate_async = mode == "separate_async";
  colocate_async = mode == "colocate_async";
  if (async_mode()) {
    if (adv_estimator == "remax")
      throw ValueError("config key 'trainer.v1.trainer_mode' = " + mode + " with algorithm.adv_estimator=remax: "
                       "the greedy baselines would come from another weight version than the samples");
    num_warmup_batches = c.get_int("trainer.v1." + mode + ".num_warmup_batches");
    max_off_policy_threshold = c.get_int("trainer.v1.sampler.max_off_policy_threshold");
    const std::string strategy = c.get_string("trainer.v1.sampler.max_off_policy_strategy");
    if (strategy != "drop" && strategy != "wait")
      throw ValueError("config key 'trainer.v1.sampler.max_off_policy_strategy': '" + strategy +
                       "' is not drop or wait");
    drop_stale = strategy == "drop";
    max_requeues = c.get_int("trainer.v1.sampler.max_requeues");
    partial_rollout = c.get_bool("async_training.partial_rollout");
    if (partial_rollout && colocate_async)
      throw ValueError("config key 'async_training.partial_rollout' with trainer.v1.trainer_mode=colocate_async: the "
                       "colocated actor updates its weights between whole generation batches; use separate_async");
    partial_segments = partial_rollout ? c.get_int("async_training.partial_rollout_segments") : 1;
    if (partial_segments > max_response_length)
      throw ValueError("config key 'async_training.partial_rollout_segments' (" + std::to_string(partial_segments) +
                       ") exceeds data.max_response_length (" + std::to_string(max_response_length) + ")");
  }
  if (separate_async) {
    rollout_world =
        c.get_int("actor_rollout_ref.rollout.nnodes") * c.get_int("actor_rollout_ref.rollout.n_gpus_per_node");
    parameter_sync_step = c.get_int("trainer.v1.separate_async.parameter_sync_step");
    // Under wait the batch a step needs must be launchable: on the last step before a sync its
    // weights are parameter_sync_step - 1 versions behind the trainer already.
    if (!drop_stale && parameter_sync_step - 1 > max_off_policy_threshold)
      throw ValueError("config key 'trainer.v1.separate_async.parameter_sync_step' (" +
                       std::to_string(parameter_sync_step) +
                       ") - 1 exceeds trainer.v1.sampler.max_off_policy_threshold (" +
                       std::to_string(max_off_policy_threshold) +
                       ") under the wait strategy: the rollout weights would lag more than the bound before each sync");
  }

  std::string cf = c.get_string("custom_reward_function.name");
  const std::string manager = c.get_string("reward_model.reward_manager");
  if (c.is_null("custom_reward_function.path")) {
    if (cf == "compute_score") cf = "default";
  } else {
    const std::string plugin = c.get_string("custom_reward_function.path");
    try {
      load_reward_plugin(plugin);
      if (manager == "batch") (void)get_batch_compute_score(cf);
      else (void)algos::reward_score::get_compute_score(cf);
    } catch (const ValueError& e) {
      throw ValueError("config key 'custom_reward_function.path': " + std::string(e.what()));
    } catch (const KeyError&) {
      throw KeyError("config key 'custom_reward_function.name': '" + cf + "' is not a registered " +
                     (manager == "batch" ? "batch " : "") + "reward function after loading '" + plugin + "'");
    }
  }
  RewardManagerOptions ropt{
      .name = manager,
      .compute_score = cf,
      .num_examine = 0,
      .max_response_length = max_response_length,
      .overlong_buffer = {.enable = c.get_bool("reward_model.overlong_buffer.enable"),
                          .len = c.get_int("reward_model.overlong_buffer.len"),
                          .penalty_factor = c.get_double("reward_model.overlong_buffer.penalty_factor")}};
  reward_fn = std::make_unique<RewardManager>(tokenizer, ropt);
  ropt.num_examine = 1;
  val_reward_fn = std::make_unique<RewardManager>(tokenizer, ropt);

  ckpt_root = c.is_null("trainer.default_local_dir") ? "checkpoints/" + c.get_string("trainer.project_name") + "/" +
                                                           c.get_string("trainer.experiment_name")
                                                     : c.get_string("trainer.default_local_dir");
  metrics_file =
      c.is_null("trainer.metrics_file") ? ckpt_root + "/metrics.jsonl" : c.get_string("trainer.metrics_file");

  // Worker configs: verl's subtrees, nulls resolved the way verl's trainer resolves them.
  nlohmann::json arr = c.subtree("actor_rollout_ref");
  auto& rollout = arr["rollout"];
  if (!rollout.contains("prompt_length")) rollout["prompt_length"] = max_prompt_length;
  if (!rollout.contains("response_length")) rollout["response_length"] = max_response_length;
  rollout["seed"] = c.get_int("trainer.seed");
  arr["actor"]["optim"]["total_training_steps"] = total_steps;
  std::vector<std::pair<std::string, WorkerSpec>> roles = {
      {"actor_rollout_ref", WorkerSpec{"ActorRolloutRefWorker", {{"config", arr}, {"role", "actor_rollout_ref"}}}}};
  if (use_critic) {
    nlohmann::json cr = c.subtree("critic");
    cr.erase("enable");
    if (cr["model"].value("path", "").empty()) cr["model"]["path"] = model_path;
    if (!cr.contains("ppo_mini_batch_size")) cr["ppo_mini_batch_size"] = arr["actor"]["ppo_mini_batch_size"];
    if (!cr.contains("ppo_epochs")) cr["ppo_epochs"] = arr["actor"]["ppo_epochs"];
    if (!cr.contains("loss_agg_mode")) cr["loss_agg_mode"] = loss_agg_mode;
    if (!cr.contains("ppo_micro_batch_size_per_gpu") && arr["actor"].contains("ppo_micro_batch_size_per_gpu"))
      cr["ppo_micro_batch_size_per_gpu"] = arr["actor"]["ppo_micro_batch_size_per_gpu"];
    cr["rollout_n"] = n;
    cr["optim"]["total_training_steps"] = total_steps;
    roles.emplace_back("critic", WorkerSpec{"CriticWorker", {{"config", cr}}});
  }
  if (use_rm) {
    // the worker's keys of the section (the reward manager keys are the trainer's)
    nlohmann::json rmc = c.subtree("reward_model");
    for (const char* trainer_key : {"enable", "reward_manager", "overlong_buffer"}) rmc.erase(trainer_key);
    roles.emplace_back("rm", WorkerSpec{"RewardModelWorker", {{"config", rmc}}});
  }
  workers::register_workers();
  std::vector<int> per_node(static_cast<size_t>(c.get_int("trainer.nnodes")),
                            static_cast<int>(c.get_int("trainer.n_gpus_per_node")));
  WorkerGroupOptions group_options;  // trainer.call_timeout_s: a call no rank answers in time fails
  if (const double timeout_s = c.get_double("trainer.call_timeout_s"); timeout_s > 0)
    group_options.call_deadline =
        std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::ceil(timeout_s * 1000))));
  // separate_async: the rollout-only workers (verl's standalone rollout replicas)
  const WorkerSpec rollout_spec{"ActorRolloutRefWorker", {{"config", arr}, {"role", "rollout"}}};
  const std::vector<int> rollout_per_node(
      separate_async ? static_cast<size_t>(c.get_int("actor_rollout_ref.rollout.nnodes")) : 0,
      static_cast<int>(c.get_int("actor_rollout_ref.rollout.n_gpus_per_node")));
  WorkerGroupOptions rollout_options = group_options;
  rollout_options.name_prefix = "rollout_";
  // trainer.device (cpu | cuda | auto): GPUs give each worker cuda:<local rank>
  const std::string device = c.get_string("trainer.device");
  if (c.is_null("cluster.nodes")) {
    runtime = std::make_unique<Runtime>();
    const int visible = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    auto pool = [&](const std::vector<int>& nodes) {  // every node's workers share this process's devices
      const bool gpu = ResourcePool::wants_gpus(device, nodes, std::vector<int>(nodes.size(), visible));
      return ResourcePool(nodes, 10, gpu ? visible : 8, gpu);
    };
    bundle.emplace(*runtime, pool(per_node), colocated_spec(roles), group_options);
    if (separate_async) rollout_wg.emplace(*runtime, pool(rollout_per_node), rollout_spec, rollout_options);
  } else {
    // workers on caf-node processes: trainer.nnodes nodes (sorted by address) with
    // n_gpus_per_node workers each
    auto opt = [&](const char* key) { return c.is_null(key) ? std::string() : c.get_string(key); };
    const cluster::TlsFiles tls{opt("cluster.tls_cert"), opt("cluster.tls_key"), opt("cluster.tls_ca")};
    // errors name the key (check_tls_files names the cluster.tls_* keys itself)
    const RuntimeOptions ro = cluster::with_tls(
        {.network = true,
         .heartbeat_interval_ms = static_cast<int>(c.get_int("cluster.heartbeat_ms")),
         .connection_timeout_ms = static_cast<int>(c.get_int("cluster.connection_timeout_ms"))},
        tls, {"cluster.tls_cert", "cluster.tls_key", "cluster.tls_ca"});
    auto with_key = [](const char* key, auto&& read) {
      try {
        return read();
      } catch (const ValueError& e) {
        throw ValueError(std::string("config key '") + key + "': " + e.what());
      }
    };
    cluster::ClusterOptions options;
    options.nodes = with_key("cluster.nodes", [&] { return cluster::parse_node_list(c.get_string("cluster.nodes")); });
    if (!c.is_null("cluster.secret_file"))
      options.secret = with_key("cluster.secret_file",
                                [&] { return cluster::read_secret_file(c.get_string("cluster.secret_file")); });
    options.tls = tls;
    if (!c.is_null("cluster.data_plane_bind") || !c.is_null("cluster.data_plane_host")) {
      // the nodes pull large arguments from this process: its data server must be reachable
      auto plane = cluster::DataPlane::process_options();
      if (!c.is_null("cluster.data_plane_bind")) plane.bind = c.get_string("cluster.data_plane_bind");
      if (!c.is_null("cluster.data_plane_host")) plane.advertise = c.get_string("cluster.data_plane_host");
      cluster::DataPlane::configure(plane);
    }
    runtime = std::make_unique<Runtime>(ro);
    auto nodes = cluster::RemoteLauncher::connect(*runtime, std::move(options));
    runtime->set_launcher(nodes);
    std::vector<int> advertised;  // GPUs per node, in the launcher's node order
    for (const auto& info : nodes->nodes()) advertised.push_back(info.gpus);
    auto pool = [&](const std::vector<int>& workers) {
      return nodes->pool(workers, ResourcePool::wants_gpus(device, workers, advertised));
    };
    bundle.emplace(*runtime, pool(per_node), colocated_spec(roles), group_options);
    // the rollout group's own workers (ranks) on the first rollout.nnodes nodes
    if (separate_async) rollout_wg.emplace(*runtime, pool(rollout_per_node), rollout_spec, rollout_options);
  }
  std::vector<std::string> names;
  for (const auto& r : roles) names.push_back(r.first);
  auto views = bundle->spawn(names);
  actor.emplace(views.at("actor_rollout_ref"));
  if (use_critic) critic.emplace(views.at("critic"));
  if (use_rm) rm.emplace(views.at("rm"));
  if (separate_async) executor = std::make_unique<SerialExecutor>();
}

void PPOTrainer::Impl::setup_rollout_correction() {
  const Config& c = config;
  const std::string p = "algorithm.rollout_correction.";
  if (!c.is_null(p + "rollout_is")) {
    rollout_is =
        algos::rollout_correction::RolloutIsOptions{.level = c.get_string(p + "rollout_is"),
                                                    .threshold = c.get_double(p + "rollout_is_threshold"),
                                                    .batch_normalize = c.get_bool(p + "rollout_is_batch_normalize")};
    if (rollout_is->level != "token" && rollout_is->level != "sequence")
      throw ValueError("config key '" + p + "rollout_is': '" + rollout_is->level + "' is not token, sequence or null");
    if (!(rollout_is->threshold > 0)) throw ValueError("config key '" + p + "rollout_is_threshold' must be > 0");
  }
  if (!c.is_null(p + "rollout_rs")) {
    if (c.is_null(p + "rollout_rs_threshold"))
      throw ValueError("config key '" + p + "rollout_rs_threshold' is required with " + p + "rollout_rs");
    rollout_rs = algos::rollout_correction::RolloutRsOptions{.level = c.get_string(p + "rollout_rs"),
                                                             .threshold = c.get_double(p + "rollout_rs_threshold")};
    if (!c.is_null(p + "rollout_rs_threshold_lower"))
      rollout_rs->threshold_lower = c.get_double(p + "rollout_rs_threshold_lower");
    const std::string& level = rollout_rs->level;
    if (level != "token" && level != "sequence" && level != "geometric")
      throw ValueError("config key '" + p + "rollout_rs': '" + level + "' is not token, sequence, geometric or null");
    const double upper = rollout_rs->threshold, lower = rollout_rs->threshold_lower.value_or(1.0 / upper);
    if (!(upper > 0)) throw ValueError("config key '" + p + "rollout_rs_threshold' must be > 0");
    if (!(lower > 0) || lower > upper)
      throw ValueError("config key '" + p + "rollout_rs_threshold_lower' (" + std::to_string(lower) +
                       ") must be in (0, rollout_rs_threshold = " + std::to_string(upper) + "]");
  }
  if (!c.is_null(p + "rollout_token_veto_threshold")) {
    rollout_token_veto = c.get_double(p + "rollout_token_veto_threshold");
    if (!(*rollout_token_veto > 0)) throw ValueError("config key '" + p + "rollout_token_veto_threshold' must be > 0");
  }
  bypass_mode = c.get_bool(p + "bypass_mode");
  const bool corrects = rollout_is || rollout_rs || rollout_token_veto;
  if (bypass_mode && corrects)
    throw ValueError("config key '" + p + "bypass_mode' with rollout_is, rollout_rs or rollout_token_veto_threshold: "
                     "bypass takes the rollout's log-probs as old_log_probs, so their ratio is 1 and there is "
                     "nothing to correct (verl applies them inside its bypass policy loss, not built here)");
  if ((corrects || bypass_mode) && !c.get_bool("actor_rollout_ref.rollout.calculate_log_probs")) {
    const char* named = bypass_mode ? "bypass_mode"
                        : rollout_is ? "rollout_is"
                        : rollout_rs ? "rollout_rs"
                                     : "rollout_token_veto_threshold";
    throw ValueError("config key '" + p + named +
                     "' needs the rollout's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=true");
  }
}

std::optional<std::vector<int64_t>> PPOTrainer::Impl::next_gen_batch(int64_t& epoch) {
  if (data_budget && data_cursor >= *data_budget) return std::nullopt;
  epoch = data_cursor / gen_batches_per_epoch;
  const int64_t b = data_cursor % gen_batches_per_epoch;
  if (epoch != order_epoch) {
    order = epoch_order(train_data->size(), config.get_bool("data.shuffle"), data_seed, epoch);
    order_epoch = epoch;
  }
  ++data_cursor;
  return std::vector<int64_t>(order.begin() + b * gen_batch_size, order.begin() + (b + 1) * gen_batch_size);
}

std::pair<DataProto, DataProto> PPOTrainer::Impl::prepare_generation(const std::vector<int64_t>& indices,
                                                                    const std::string& uid_prefix) {
  DataProto batch = train_data->batch(indices);
  dataproto::Column uid;
  for (size_t i = 0; i < indices.size(); ++i) uid.emplace_back(uid_prefix + std::to_string(i));
  batch.non_tensor_batch["uid"] = std::move(uid);
  DataProto gen_batch = batch.pop({"input_ids", "attention_mask", "position_ids"}).repeat(n, /*interleave=*/true);
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

DataProto PPOTrainer::Impl::generate(const std::vector<int64_t>& indices, const std::string& uid_prefix,
                                     nlohmann::json& m) {
  auto [batch, gen_batch] = prepare_generation(indices, uid_prefix);
  DataProto gen_out;
  {
    Timer t(m, "gen");
    gen_out = actor->call(&ActorRolloutRefWorker::generate_sequences, gen_batch);
  }
  record_rollout_handoff(gen_out.meta_info, m);
  batch = batch.repeat(n, /*interleave=*/true);
  std::optional<at::Tensor> reward_baselines;
  if (adv_estimator == "remax") {
    Timer t(m, "gen_max");
    DataProto greedy_in = gen_batch;
    greedy_in.meta_info["do_sample"] = false;
    DataProto greedy = actor->call(&ActorRolloutRefWorker::generate_sequences, greedy_in);
    greedy.union_with(batch);
    reward_baselines = (*reward_fn)(greedy).reward_tensor.sum(-1);
  }
  batch = with_rollout(std::move(batch), gen_out);
  if (reward_baselines) batch.batch.set("reward_baselines", *reward_baselines);
  return batch;
}

void PPOTrainer::Impl::launch_generation() {
  Requeued prompts;
  if (!requeue.empty()) {  // the replay buffer goes first; it takes no fresh data
    prompts = std::move(requeue.front());
    requeue.pop_front();
  } else {
    // uids name the generation batch: it is trained at an unknown step
    prompts.origin = "b" + std::to_string(data_cursor);
    const auto indices = next_gen_batch(prompts.epoch);
    if (!indices) throw Error("launch_generation: no training data left");  // top_up checks first
    prompts.indices = *indices;
  }
  const std::string uid_prefix =
      prompts.origin + (prompts.times > 0 ? "-r" + std::to_string(prompts.times) : std::string()) + "-";
  auto [batch, gen_batch] = prepare_generation(prompts.indices, uid_prefix);
  InFlight item{std::move(batch), prompts.epoch, data_cursor, generation_version, {}, std::move(prompts)};
  if (colocate_async) {
    item.result = generate_colocated(std::move(gen_batch));
    in_flight.push_back(std::move(item));
    return;
  }
  auto promise = std::make_shared<std::promise<DataProto>>();
  item.result = promise->get_future().share();
  in_flight.push_back(std::move(item));
  submit_segment(std::move(promise), std::move(gen_batch), 0);
}

int64_t PPOTrainer::Impl::replay_buffer_groups() const {
  int64_t groups = 0;
  for (const auto& item : in_flight)
    if (item.prompts.times > 0) groups += static_cast<int64_t>(item.prompts.indices.size());
  for (const auto& r : requeue) groups += static_cast<int64_t>(r.indices.size());
  return groups;
}

nlohmann::json PPOTrainer::Impl::replay_buffer_state() const {
  // Batches still generating are not consumed (the resumed run generates them again): the requeued
  // ones among them come first, in launch order, then those waiting.
  nlohmann::json out = nlohmann::json::array();
  auto add = [&](const Requeued& r) {
    out.push_back({{"indices", r.indices}, {"epoch", r.epoch}, {"times", r.times}, {"origin", r.origin}});
  };
  for (const auto& item : in_flight)
    if (item.prompts.times > 0) add(item.prompts);
  for (const auto& r : requeue) add(r);
  return out;
}

std::shared_future<DataProto> PPOTrainer::Impl::generate_colocated(DataProto gen_batch) {
  // Issued from the controller thread before this step's log-prob and update calls, so every rank
  // receives it first: it samples with the weights of now, and the ranks' call order (hence their
  // RNG draws) is the controller's order, not timing.
  auto promise = std::make_shared<std::promise<DataProto>>();
  DataProtoFuture generated =
      actor->call(CallOptions{.blocking = false}, &ActorRolloutRefWorker::generate_sequences, std::move(gen_batch));
  generated.then([promise](DataProto out) { promise->set_value(std::move(out)); },
                 [promise](std::exception_ptr error) { promise->set_exception(error); });
  return promise->get_future().share();
}

void PPOTrainer::Impl::submit_segment(std::shared_ptr<std::promise<DataProto>> promise, DataProto input,
                                      int64_t segment) {
  // Segment k of S generates R/S tokens (the first R mod S segments one more). A weight update
  // published meanwhile is queued before the next segment, so the rows go on with the new version.
  const int64_t length = max_response_length / partial_segments + (segment < max_response_length % partial_segments);
  executor->submit([this, promise = std::move(promise), input = std::move(input), segment, length]() mutable {
    if (auto error = executor->failure()) {
      promise->set_exception(error);
      return;
    }
    try {
      input.meta_info["response_length"] = length;
      DataProto out = segment == 0 ? DataProto(rollout_wg->call(&ActorRolloutRefWorker::generate_sequences, input))
                                   : DataProto(rollout_wg->call(&ActorRolloutRefWorker::continue_sequences, input));
      if (segment + 1 < partial_segments) {
        submit_segment(std::move(promise), std::move(out), segment + 1);
        return;
      }
      promise->set_value(std::move(out));
    } catch (...) {
      promise->set_exception(std::current_exception());
      throw;  // marks the executor failed: later generations do not run on an unknown state
    }
  });
}

void PPOTrainer::Impl::top_up(int64_t step, bool popped_this_step) {
  while (static_cast<int64_t>(in_flight.size()) < num_warmup_batches &&
         (!requeue.empty() || !data_budget || data_cursor < *data_budget)) {
    // A batch launched now runs on generation_version; each step takes at least one batch, so at
    // queue position q it is trained at the latest by step `step + q` (+1 once this step took its
    // batch), whose update starts from version step + q - 1 (+1).
    const int64_t trained_version_bound =
        step - 1 + static_cast<int64_t>(in_flight.size()) + (popped_this_step ? 1 : 0);
    if (!drop_stale && trained_version_bound - generation_version > max_off_policy_threshold) break;
    launch_generation();
  }
}

void PPOTrainer::Impl::publish_weights(int64_t version) {
  const Value parts = actor->call(&ActorRolloutRefWorker::export_weights);  // one DataProto per rank
  if (!parts.is_list() || parts.list().empty() || !parts.list().front().is_dataproto())
    throw Error("export_weights: expected one DataProto per rank, got " + parts.kind());
  DataProto weights = parts.list().front().dataproto();  // rank 0 answers for the whole actor
  weights.meta_info["weight_version"] = version;
  generation_version = version;  // batches launched from now on queue behind this load
  executor->submit([this, weights = std::move(weights)] {
    if (executor->failure()) return;
    rollout_wg->call(&ActorRolloutRefWorker::load_weights, weights);
  });
}

std::optional<nlohmann::json> PPOTrainer::Impl::async_step(int64_t global_step) {
  nlohmann::json m = nlohmann::json::object();
  const auto step_start = std::chrono::steady_clock::now();
  const int64_t trained_version = global_step - 1;  // the version this step's update starts from
  std::optional<DynamicSampler> sampler;
  if (filter_groups) sampler.emplace(train_batch_size, n, max_num_gen_batches);
  int64_t dropped = 0, requeued = 0, epoch = 0;
  DataProto batch;
  for (;;) {
    top_up(global_step, /*popped_this_step=*/false);
    if (in_flight.empty()) return std::nullopt;  // the data of total_epochs ran out
    InFlight item = std::move(in_flight.front());
    in_flight.pop_front();
    consumed_cursor = item.cursor_after;
    epoch = item.epoch;
    DataProto out;
    {
      Timer t(m, "gen");  // verl V1: the trainer's wait for its next batch
      out = item.result.get();
    }
    if (colocate_async) {  // the colocated actor holds no published version: the controller knows it
      const auto version = torch::full({out.size()}, item.version, torch::kLong);
      out.batch.set("min_weight_version", version);
      out.batch.set("max_weight_version", version.clone());
    }
    DataProto rows = with_rollout(item.batch.repeat(n, /*interleave=*/true), out);
    const int64_t worst = trained_version - rows.batch.at("min_weight_version").min().item<int64_t>();
    if (worst > max_off_policy_threshold) {
      if (!drop_stale)
        throw Error(std::string(colocate_async ? "colocate_async" : "separate_async") +
                    ": a generation batch lags " + std::to_string(worst) +
                    " versions under the wait strategy (max_off_policy_threshold " +
                    std::to_string(max_off_policy_threshold) + ")");
      dropped += rows.size();  // all its groups started on that version
      if (item.prompts.times < max_requeues) {  // the replay buffer: generate them again on newer weights
        requeued += static_cast<int64_t>(item.prompts.indices.size());
        ++item.prompts.times;
        requeue.push_back(std::move(item.prompts));
      }
      continue;
    }
    // colocate_async: the next batches go to the workers now, so their generation overlaps this
    // batch's scoring and preparation on the controller (and queues before this step's calls)
    if (colocate_async && global_step < total_steps) top_up(global_step, /*popped_this_step=*/true);
    score(rows, m);
    if (!sampler) {
      batch = std::move(rows);
      break;
    }
    sampler->add(rows, filter_metric_values(rows, filter_metric));
    if (sampler->full()) {
      m["train/num_gen_batches"] = sampler->num_gen_batches();
      batch = sampler->take();
      break;
    }
  }
  // separate_async: the next batches generate while this one trains
  if (separate_async) top_up(global_step, /*popped_this_step=*/true);
  m["training/off_policy/dropped_trajectories"] = dropped;
  if (max_requeues > 0) {
    m["training/off_policy/requeued_groups"] = requeued;
    m["training/off_policy/replay_buffer_groups"] = replay_buffer_groups();
  }
  m.update(off_policy_metrics(batch, trained_version));
  balance_and_count(batch, m);
  return train(batch, global_step, epoch, std::move(m), step_start,
               [&](nlohmann::json& metrics) { after_actor_update(global_step, metrics); });
}

void PPOTrainer::Impl::after_actor_update(int64_t step, nlohmann::json& m) {
  if (colocate_async) {
    generation_version = step;
    return;
  }
  if (step % parameter_sync_step != 0) return;
  Timer t(m, "update_weights");
  publish_weights(step);
}

void PPOTrainer::Impl::balance_and_count(DataProto& batch, nlohmann::json& m) {
  if (config.get_bool("trainer.balance_batch")) balance_batch(batch, world, m);
  const auto seq_tokens = batch.batch.at("attention_mask").sum(-1);
  batch.meta_info["global_token_num"] =
      std::vector<int64_t>(seq_tokens.data_ptr<int64_t>(), seq_tokens.data_ptr<int64_t>() + seq_tokens.numel());
}

void PPOTrainer::Impl::score(DataProto& batch, nlohmann::json& m) {
  Timer t(m, "reward");
  if (use_rm) batch.union_with(DataProto(rm->call(&RewardModelWorker::compute_rm_score, batch)));
  RewardOutput r = (*reward_fn)(batch);
  batch.batch.set("token_level_scores", r.reward_tensor);
  for (auto& [k, v] : r.reward_extra_info)
    if (static_cast<int64_t>(v.size()) == batch.size())
      batch.non_tensor_batch[k] = dataproto::Column(v.begin(), v.end());
}

nlohmann::json PPOTrainer::Impl::step(int64_t global_step, int64_t epoch, const std::vector<int64_t>& indices) {
  nlohmann::json m = nlohmann::json::object();
  const auto step_start = std::chrono::steady_clock::now();
  DataProto batch = generate(indices, "s" + std::to_string(global_step) + "-", m);
  balance_and_count(batch, m);
  score(batch, m);
  return train(batch, global_step, epoch, std::move(m), step_start);
}

std::optional<nlohmann::json> PPOTrainer::Impl::dynamic_step(int64_t global_step) {
  nlohmann::json m = nlohmann::json::object();
  const auto step_start = std::chrono::steady_clock::now();
  DynamicSampler sampler(train_batch_size, n, max_num_gen_batches);
  int64_t epoch = 0;
  while (!sampler.full()) {
    const auto indices = next_gen_batch(epoch);
    if (!indices) return std::nullopt;
    // rows are filtered and trimmed by prompt group before balancing, which reorders them
    DataProto batch = generate(
        *indices, "s" + std::to_string(global_step) + "-g" + std::to_string(sampler.num_gen_batches()) + "-", m);
    score(batch, m);
    sampler.add(batch, filter_metric_values(batch, filter_metric));
  }
  m["train/num_gen_batches"] = sampler.num_gen_batches();
  DataProto batch = sampler.take();
  balance_and_count(batch, m);
  return train(batch, global_step, epoch, std::move(m), step_start);
}

nlohmann::json PPOTrainer::Impl::train(DataProto& batch, int64_t global_step, int64_t epoch, nlohmann::json m,
                                       std::chrono::steady_clock::time_point step_start,
                                       const std::function<void(nlohmann::json&)>& after_update) {
  if (bypass_mode) {  // verl's bypass mode: the rollout's log-probs are the old policy, no recompute
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
  rollout_correction(batch, m);
  if (use_kl_loss || use_kl_in_reward) {
    Timer t(m, "ref");
    DataProto ref = actor->call(&ActorRolloutRefWorker::compute_ref_log_prob, batch);
    batch.union_with(
        ref.select(std::vector<std::string>{"ref_log_prob"}, std::vector<std::string>{}, std::vector<std::string>{}));
  }
  if (use_critic) {
    Timer t(m, "values");
    DataProto v = critic->call(&CriticWorker::compute_values, batch);
    batch.union_with(
        v.select(std::vector<std::string>{"values"}, std::vector<std::string>{}, std::vector<std::string>{}));
  }
  {
    Timer t(m, "adv");
    if (use_kl_in_reward) {
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
    auto out = algos::core_algos::get_adv_estimator_fn(adv_estimator)(in);
    batch.batch.set("advantages", out.advantages);
    batch.batch.set("returns", out.returns);
  }
  if (use_critic) {
    Timer t(m, "update_critic");
    DataProto out = critic->call(&CriticWorker::update_critic, batch);
    for (const auto& [k, v] : algos::metric_utils::reduce_metrics(out.meta_info.at("metrics"))) m[k] = v;
  }
  if (config.get_int("trainer.critic_warmup") <= global_step) {
    Timer t(m, "update_actor");
    DataProto out = actor->call(&ActorRolloutRefWorker::update_actor, batch);
    for (const auto& [k, v] : algos::metric_utils::reduce_metrics(out.meta_info.at("metrics"))) m[k] = v;
  }
  if (after_update) after_update(m);
  const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
  m["timing_s/step"] = step_s;
  std::map<std::string, double> timing_raw;
  for (const auto& [k, v] : m.items())
    if (k.rfind("timing_s/", 0) == 0) timing_raw[k.substr(9)] = v.get<double>();
  m.update(algos::metric_utils::compute_data_metrics(batch, use_critic));
  m.update(algos::metric_utils::compute_timing_metrics(batch, timing_raw));
  m.update(algos::metric_utils::compute_throughout_metrics(batch, timing_raw, world + rollout_world));
  m["training/global_step"] = global_step;
  m["training/epoch"] = epoch;
  return m;
}

void PPOTrainer::Impl::rollout_correction(DataProto& batch, nlohmann::json& m) {
  namespace rc = algos::rollout_correction;
  if (!rollout_is && !rollout_rs && !rollout_token_veto) return;
  const at::Tensor old_lp = batch.batch.at("old_log_probs"), rollout_lp = batch.batch.at("rollout_log_probs");
  const at::Tensor mask = batch.batch.at("response_mask");
  if (rollout_is) {  // verl's decoupled mode: the actor multiplies its per-token loss by the weights
    auto r = rc::compute_rollout_is_weights(old_lp, rollout_lp, mask, *rollout_is);
    batch.batch.set("rollout_is_weights", r.weights);
    m.update(r.metrics);
  }
  // rejected tokens and vetoed rows leave response_mask: no advantage, no loss, not counted
  at::Tensor kept = mask;
  if (rollout_rs) {
    auto r = rc::compute_rollout_rejection_mask(old_lp, rollout_lp, mask, *rollout_rs);
    kept = r.response_mask;
    m.update(r.metrics);
  }
  if (rollout_token_veto) {
    auto r = rc::compute_token_veto_mask(old_lp, rollout_lp, mask, *rollout_token_veto);
    kept = kept * r.response_mask;
    m.update(r.metrics);
  }
  if (kept.sum().item<int64_t>() == 0)
    throw ValueError("algorithm.rollout_correction: rollout_rs / rollout_token_veto_threshold rejected every response "
                     "token of the batch (" + m.dump() + "); loosen the thresholds");
  batch.batch.set("response_mask", kept);
}

nlohmann::json PPOTrainer::Impl::validate() {
  const int64_t val_n = config.get_int("actor_rollout_ref.rollout.val_kwargs.n");
  const int64_t bs = config.is_null("data.val_batch_size") ? val_data->size() : config.get_int("data.val_batch_size");
  // verl's _validate: per sample its data source, its prompt's uid, the reward and every
  // reward_extra_info column
  std::vector<std::string> sources, uids;
  std::map<std::string, std::vector<nlohmann::json>> infos;
  std::vector<double> resp_lens;
  for (int64_t start = 0; start < val_data->size(); start += bs) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(start + bs, val_data->size()); ++i) idx.push_back(i);
    DataProto test = val_data->batch(idx);
    dataproto::Column uid;
    for (int64_t i : idx) uid.emplace_back("val-" + std::to_string(i));
    test.non_tensor_batch["uid"] = std::move(uid);
    test = test.repeat(val_n, true);
    DataProto gen = test.pop({"input_ids", "attention_mask", "position_ids"});
    gen.meta_info["validate"] = true;
    gen.meta_info["do_sample"] = config.get_bool("actor_rollout_ref.rollout.val_kwargs.do_sample");
    auto [padded, pad] = pad_dataproto_to_divisor(gen, world);
    DataProto out = actor->call(&ActorRolloutRefWorker::generate_sequences, padded);
    out = unpad_dataproto(out, pad);
    test.union_with(out);
    RewardOutput r = (*val_reward_fn)(test);
    const auto scores = r.reward_tensor.sum(-1).to(at::kDouble).contiguous();
    const int64_t T = test.batch.at("responses").size(1);
    const auto lens = test.batch.at("attention_mask").narrow(1, -T, T).sum(-1);
    for (int64_t i = 0; i < test.size(); ++i) {
      const auto row = static_cast<size_t>(i);
      sources.push_back(test.non_tensor_batch.at("data_source").at(row).get<std::string>());
      uids.push_back(test.non_tensor_batch.at("uid").at(row).get<std::string>());
      infos["reward"].push_back(scores[i].item<double>());
      resp_lens.push_back(lens[i].item<double>());
    }
    for (const auto& [key, values] : r.reward_extra_info)
      if (key != "reward") infos[key].insert(infos[key].end(), values.begin(), values.end());
  }
  nlohmann::json m = algos::metric_utils::validation_metric_sections(
      algos::metric_utils::process_validation_metrics(sources, uids, infos));
  double total = 0;
  for (double l : resp_lens) total += l;
  if (!resp_lens.empty()) m["val-aux/response_length/mean"] = total / static_cast<double>(resp_lens.size());
  return m;
}

void PPOTrainer::Impl::save_checkpoint(int64_t global_step) {
  const fs::path root(ckpt_root);
  fs::create_directories(root);
  const fs::path final_dir = root / ("global_step_" + std::to_string(global_step));
  const fs::path tmp = root / ("global_step_" + std::to_string(global_step) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  actor->call(&ActorRolloutRefWorker::save_checkpoint, (tmp / "actor").string(), global_step);
  if (use_critic) critic->call(&CriticWorker::save_checkpoint, (tmp / "critic").string(), global_step);
  nlohmann::json state = {
      {"global_step", global_step},
      // separate_async: the batches still generating are not consumed; a resumed run generates them again
      {"data_cursor", async_mode() ? consumed_cursor : data_cursor},
      {"gen_batch_size", gen_batch_size}};
  if (kl_ctrl) state["kl_coef"] = kl_ctrl->value;
  if (max_requeues > 0) state["replay_buffer"] = replay_buffer_state();
  write_text_atomically(tmp / "data.json", state.dump(2));
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);  // the folder appears complete or not at all
  write_text_atomically(root / "latest_checkpointed_iteration.txt", std::to_string(global_step));

  std::optional<int64_t> keep;
  for (const char* key : {"trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"})
    if (!config.is_null(key) && config.get_int(key) > 0)
      keep = keep ? std::min(*keep, config.get_int(key)) : config.get_int(key);
  if (!keep) return;
  std::vector<std::pair<int64_t, fs::path>> dirs;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("global_step_", 0) == 0 && name.find(".tmp") == std::string::npos)
      dirs.emplace_back(step_of(e.path()), e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; i + static_cast<size_t>(*keep) < dirs.size(); ++i) fs::remove_all(dirs[i].second);
}

int64_t PPOTrainer::Impl::load_checkpoint() {
  const std::string mode = config.get_string("trainer.resume_mode");
  data_cursor = 0;
  fs::path dir;
  if (mode == "disable") return 0;
  if (mode == "auto") {
    const fs::path tracker = fs::path(ckpt_root) / "latest_checkpointed_iteration.txt";
    if (!fs::exists(tracker)) return 0;
    std::ifstream in(tracker);
    int64_t step = 0;
    if (!(in >> step)) throw FormatError("unreadable checkpoint tracker " + tracker.string());
    dir = fs::path(ckpt_root) / ("global_step_" + std::to_string(step));
  } else if (mode == "resume_path") {
    if (config.is_null("trainer.resume_from_path"))
      throw ValueError("config key 'trainer.resume_from_path' is required with resume_mode=resume_path");
    dir = config.get_string("trainer.resume_from_path");
    if (dir.string().find("global_step_") == std::string::npos)
      throw ValueError("config key 'trainer.resume_from_path' must name a global_step_N folder, got '" + dir.string() +
                       "'");
  } else {
    throw ValueError("config key 'trainer.resume_mode': unknown mode '" + mode + "' (disable, auto, resume_path)");
  }
  const int64_t step = step_of(dir);
  actor->call(&ActorRolloutRefWorker::load_checkpoint, (dir / "actor").string());
  if (use_critic) critic->call(&CriticWorker::load_checkpoint, (dir / "critic").string());
  const nlohmann::json state = read_trainer_state(dir / "data.json", step);
  // data position: older checkpoints (plain loop, one generation batch per step) lack it
  data_cursor = step;
  if (state.contains("data_cursor")) {
    if (!state.at("data_cursor").is_number_integer() || state.at("data_cursor").get<int64_t>() < step)
      throw FormatError((dir / "data.json").string() + ": data_cursor " + state.at("data_cursor").dump() +
                        " is not an integer >= global_step " + std::to_string(step));
    data_cursor = state.at("data_cursor").get<int64_t>();
  }
  consumed_cursor = data_cursor;
  requeue = read_replay_buffer(state, dir / "data.json");
  if (state.contains("gen_batch_size") && state.at("gen_batch_size") != gen_batch_size)
    throw ValueError("config key 'data.gen_batch_size' (" + std::to_string(gen_batch_size) + ") differs from " +
                     state.at("gen_batch_size").dump() + " of the checkpoint " + dir.string() +
                     ": its data position counts generation batches of that size");
  if (kl_ctrl) {
    if (!state.contains("kl_coef") || !state.at("kl_coef").is_number())
      throw FormatError((dir / "data.json").string() + ": no numeric kl_coef (algorithm.use_kl_in_reward is on)");
    kl_ctrl->value = state.at("kl_coef").get<double>();
  }
  std::cout << "resumed from " << dir.string() << " (global step " << step << ")\n";
  return step;
}

void PPOTrainer::Impl::prepare_metrics_file(int64_t resumed_step) {
  const fs::path file(metrics_file);
  if (!fs::exists(file)) return;
  if (resumed_step == 0) {  // a fresh run: the file belongs to an earlier run
    const fs::path old = free_path(file, ".old");
    fs::rename(file, old);
    std::cout << "metrics of an earlier run moved to " << old.string() << "\n";
    return;
  }
  // Resumed at step S: the earlier run may have logged steps after its last checkpoint, which
  // this run takes again. Keep lines up to S in the file and move the rest to a side file.
  std::ifstream in(file);
  std::string kept, later, line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.empty()) continue;
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_object() || !row.contains("step") || !row.at("step").is_number_integer())
      throw FormatError(file.string() + ":" + std::to_string(lineno) + ": not a metrics line with an integer step");
    (row.at("step").get<int64_t>() <= resumed_step ? kept : later) += line + "\n";
  }
  in.close();
  if (later.empty()) return;
  const fs::path side = free_path(file, ".after_step_" + std::to_string(resumed_step));
  {
    std::ofstream out(side, std::ios::trunc);
    out << later;
    if (!out) throw Error("cannot write " + side.string());
  }
  write_text_atomically(file, kept);
  std::cout << "metrics logged after step " << resumed_step << " by the earlier run moved to " << side.string()
            << "\n";
}

void PPOTrainer::Impl::log(const nlohmann::json& metrics, int64_t step, bool progress) {
  nlohmann::json line = metrics;
  line["step"] = step;
  history.push_back(line);
  fs::path p(metrics_file);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  std::ofstream(metrics_file, std::ios::app) << line.dump() << "\n";
  if (!progress) return;
  std::cout << format_progress(metrics, step, total_steps) << std::endl;
}

PPOTrainer::PPOTrainer(const Config& config) : impl_(std::make_unique<Impl>(config)) { impl_->setup(); }
PPOTrainer::~PPOTrainer() = default;

void PPOTrainer::init_workers() {
  impl_->actor->call(&ActorRolloutRefWorker::init_model);
  if (impl_->rollout_wg) impl_->rollout_wg->call(&ActorRolloutRefWorker::init_model);
  if (impl_->critic) impl_->critic->call(&CriticWorker::init_model);
  if (impl_->rm) impl_->rm->call(&RewardModelWorker::init_model);
}

nlohmann::json PPOTrainer::validate() { return impl_->validate(); }
const std::vector<nlohmann::json>& PPOTrainer::history() const { return impl_->history; }
int64_t PPOTrainer::total_training_steps() const { return impl_->total_steps; }
std::string PPOTrainer::checkpoint_dir() const { return impl_->ckpt_root; }

void PPOTrainer::fit() {
  Impl& s = *impl_;
  const bool progress = s.config.get_bool("trainer.progress_bar");
  int64_t global_step = s.load_checkpoint();
  s.prepare_metrics_file(global_step);
  if (s.config.get_bool("trainer.val_before_train") && global_step == 0) {
    nlohmann::json m = nlohmann::json::object();
    {
      Timer t(m, "testing");
      m.update(s.validate());
    }
    s.log(m, 0, progress);
    if (s.config.get_bool("trainer.val_only")) return;
  }
  const int64_t test_freq = s.config.get_int("trainer.test_freq");
  const int64_t save_freq = s.config.get_int("trainer.save_freq");
  s.generation_version = global_step;
  if (s.separate_async) s.publish_weights(global_step);  // the rollout group starts from the trained weights
  while (global_step < s.total_steps) {
    std::optional<nlohmann::json> stepped;
    if (s.async_mode()) {
      stepped = s.async_step(global_step + 1);
    } else if (s.filter_groups) {
      stepped = s.dynamic_step(global_step + 1);
    } else {
      int64_t epoch = 0;
      if (const auto idx = s.next_gen_batch(epoch)) stepped = s.step(global_step + 1, epoch, *idx);
    }
    if (!stepped) {
      std::cout << "the training data of trainer.total_epochs ran out at step " << global_step << " of "
                << s.total_steps << "\n";
      break;
    }
    nlohmann::json& m = *stepped;
    ++global_step;
    const bool last = global_step == s.total_steps;
    if (test_freq > 0 && (last || global_step % test_freq == 0)) {
      Timer t(m, "testing");
      m.update(s.validate());
    }
    if (save_freq > 0 && (last || global_step % save_freq == 0)) {
      Timer t(m, "save_checkpoint");
      s.save_checkpoint(global_step);
    }
    s.log(m, global_step, progress);
  }
  if (s.executor) {  // generation batches launched ahead of steps that will not come
    s.executor->drain();
    s.in_flight.clear();
  }
  s.settle_colocated();
}

}  // namespace hyflow::trainer
