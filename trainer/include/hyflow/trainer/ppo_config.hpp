#pragma once
// The PPO-family trainer's configuration as typed sections, read with verl's key names by the
// same reader the role workers use (hyflow/core/config_section.hpp). The read calls declare the
// keys: the trainer's key table and --help are built from them and from the workers' own
// declarations, so every key has one owner. read_ppo_config runs every check that does not need
// the data, the workers' included (their subtrees are parsed on the controller), before anything
// is loaded or launched: a bad value fails at once, naming the key.

#include <hyflow/core/config_key.hpp>
#include <hyflow/tracking/run_info.hpp>
#include <hyflow/trainer/config.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::trainer {

/// data.synthetic: the built-in task used when no data files are given.
struct SyntheticDataSection {
  std::string task = "arithmetic";
  int64_t train_size = 2048;
  int64_t val_size = 128;
  int64_t max_operand = 99;
  int64_t seed = 0;
};

/// data
struct DataSection {
  std::string train_files;  ///< JSONL or Parquet, comma separated; empty: data.synthetic
  std::string val_files;
  std::string prompt_key = "prompt";
  int64_t max_prompt_length = 512;
  int64_t max_response_length = 512;
  int64_t train_batch_size = 1024;
  std::optional<int64_t> gen_batch_size;  ///< filter_groups: prompts per generation batch (unset: train_batch_size)
  std::optional<int64_t> val_batch_size;  ///< unset: the whole validation set at once
  bool shuffle = true;
  std::optional<int64_t> seed;  ///< shuffle seed (unset: 1)
  std::string truncation = "error";
  bool filter_overlong_prompts = false;
  SyntheticDataSection synthetic;
  /// verl's apply_chat_template_kwargs: how the agent loops render prompts (copied into the rollout
  /// section; docs/agents.md, "A compact prompt").
  std::optional<std::string> default_system;
  bool list_tools = true;
};

/// algorithm.kl_ctrl
struct KlCtrlSection {
  std::string type = "fixed";
  double kl_coef = 0.001;
  int64_t horizon = 10000;
  double target_kl = 0.1;
};

/// algorithm.filter_groups (DAPO dynamic sampling)
struct FilterGroupsSection {
  bool enable = false;
  std::optional<std::string> metric;
  int64_t max_num_gen_batches = 0;  ///< 0 or less: unlimited
};

/// algorithm.rollout_correction
struct RolloutCorrectionSection {
  std::optional<std::string> rollout_is;  ///< token | sequence
  double rollout_is_threshold = 2.0;
  bool rollout_is_batch_normalize = false;
  std::optional<std::string> rollout_rs;  ///< token | sequence | geometric
  std::optional<double> rollout_rs_threshold;
  std::optional<double> rollout_rs_threshold_lower;  ///< unset: 1 / rollout_rs_threshold
  std::optional<double> rollout_token_veto_threshold;
  bool bypass_mode = false;
  /// Whether any correction (IS weights, rejection, veto) is on.
  bool corrects() const { return rollout_is || rollout_rs || rollout_token_veto_threshold; }
};

/// algorithm
struct AlgorithmSection {
  std::string adv_estimator = "gae";
  double gamma = 1.0;
  double lam = 1.0;
  bool norm_adv_by_std_in_grpo = true;
  bool use_kl_in_reward = false;
  std::string kl_penalty = "kl";
  KlCtrlSection kl_ctrl;
  FilterGroupsSection filter_groups;
  RolloutCorrectionSection rollout_correction;
};

/// trainer.v1 (asynchronous training) and async_training
struct AsyncSection {
  std::string trainer_mode = "sync";  ///< sync | colocate_async | separate_async
  int64_t colocate_num_warmup_batches = 1;
  int64_t separate_num_warmup_batches = 1;
  int64_t parameter_sync_step = 1;
  int64_t max_off_policy_threshold = 8;
  std::string max_off_policy_strategy = "drop";  ///< drop | wait
  int64_t max_requeues = 0;
  bool partial_rollout = false;  ///< async_training.partial_rollout
  int64_t partial_rollout_segments = 2;
  /// actor_rollout_ref.rollout.nnodes / n_gpus_per_node: the separate rollout group's placement
  int64_t rollout_nnodes = 1;
  int64_t rollout_n_gpus_per_node = 1;
  bool separate() const { return trainer_mode == "separate_async"; }
  bool colocate() const { return trainer_mode == "colocate_async"; }
  bool enabled() const { return separate() || colocate(); }
  int64_t num_warmup_batches() const { return colocate() ? colocate_num_warmup_batches : separate_num_warmup_batches; }
};

/// trainer
struct TrainerSection {
  int64_t total_epochs = 30;
  std::optional<int64_t> total_training_steps;  ///< unset: epochs x batches per epoch
  bool balance_batch = true;
  std::string project_name = "hyflow";
  std::string experiment_name = "run";
  std::vector<std::string> logger{"console", "jsonl"};  ///< trackers (hyflow/tracking)
  std::optional<int64_t> console_every;  ///< console line every N steps; unset: 1 on a terminal, else 10
  int64_t nnodes = 1;
  int64_t n_gpus_per_node = 1;
  int64_t save_freq = -1;
  int64_t test_freq = -1;
  bool val_before_train = true;
  bool val_only = false;
  int64_t critic_warmup = 0;
  std::string resume_mode = "auto";  ///< disable | auto | resume_path
  std::optional<std::string> resume_from_path;
  std::optional<std::string> default_local_dir;  ///< unset: checkpoints/{project_name}/{experiment_name}
  std::optional<int64_t> max_actor_ckpt_to_keep;
  std::optional<int64_t> max_critic_ckpt_to_keep;
  std::string device = "cpu";  ///< cpu | cuda | auto
  int64_t seed = 1;
  std::optional<std::string> metrics_file;  ///< unset: {default_local_dir}/metrics.jsonl
  double call_timeout_s = 600.0;  ///< verl's collective timeout; 0: wait forever
  /// verl's trainer.profile_steps: global steps whose step timeline is written to
  /// {default_local_dir}/timeline/step_<N>.trace.json (empty: none; docs/profiling.md).
  std::vector<int64_t> profile_steps;
  tracking::PrometheusEndpoint prometheus;  ///< trainer.prometheus.*: the prometheus tracker's endpoint
  int64_t world_size() const { return nnodes * n_gpus_per_node; }
  /// default_local_dir, resolved.
  std::string local_dir() const;
};

/// cluster: workers on caf-node processes (unset nodes: in this process)
struct ClusterSection {
  std::optional<std::string> nodes;
  std::optional<std::string> secret_file;
  int64_t heartbeat_ms = 500;
  int64_t connection_timeout_ms = 3000;
  std::optional<std::string> tls_cert, tls_key, tls_ca;
  std::optional<std::string> data_plane_bind, data_plane_host;
};

/// The trainer's keys of reward_model (the reward manager) and custom_reward_function.
struct RewardSection {
  bool enable = false;                   ///< reward_model.enable: a reward model worker scores the rollouts
  std::string reward_manager = "naive";  ///< naive | dapo | batch
  bool overlong_buffer_enable = false;
  int64_t overlong_buffer_len = 0;
  double overlong_buffer_penalty_factor = 1.0;
  std::optional<std::string> custom_function_path;  ///< custom_reward_function.path (a plugin library)
  std::string custom_function_name = "compute_score";
};

/// Everything the PPO-family trainer reads; the worker subtrees stay JSON (the workers parse them).
struct PPOConfig {
  DataSection data;
  AlgorithmSection algorithm;
  TrainerSection trainer;
  ClusterSection cluster;
  RewardSection reward;
  AsyncSection async;
  std::optional<bool> critic_enable;  ///< critic.enable (unset: on for gae)
  /// actor_rollout_ref, critic and reward_model subtrees as the user gave them (nulls dropped).
  nlohmann::json actor_rollout_ref, critic, reward_model;

  bool use_critic() const { return critic_enable.value_or(algorithm.adv_estimator == "gae"); }
  bool use_rm() const { return reward.enable; }
  /// actor_rollout_ref.rollout.n (checked >= 1).
  int64_t rollout_n() const;
};

/// Reads and checks every key of `config` (its ppo schema): the trainer's sections, the
/// cross-key rules (batch sizes against the workers, async and rollout-correction settings,
/// tracker names), and the workers' sections (parsed as the trainer will hand them over; the
/// schedule length, which needs the data, is checked again when it is known). ValueError /
/// KeyError naming the key.
PPOConfig read_ppo_config(const Config& config);

/// The trainer's own keys (data, algorithm, trainer, cluster, ... and the verl keys accepted for
/// compatibility), declared by the readers of read_ppo_config; the ppo schema adds the workers'.
std::vector<ConfigKey> ppo_trainer_config_keys();

}  // namespace hyflow::trainer
