#pragma once
// The PPO-family trainer (verl's RayPPOTrainer.fit) as plain C++ over worker groups: the
// actor_rollout_ref role (and the critic for GAE, the rm role when reward_model.enable) are
// colocated on one resource pool; every step generates rollout.n samples per prompt, scores
// them, recomputes old/ref log-probs and values, computes advantages on the controller,
// updates the critic and then the actor, validates, checkpoints and logs verl's metrics.

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/trainer/config.hpp>

#include <memory>
#include <string>
#include <vector>

namespace hyflow::trainer {

class PPOTrainer {
 public:
  /// Builds tokenizer, datasets, reward managers and the colocated worker groups from the
  /// config (model weights are loaded by init_workers).
  explicit PPOTrainer(const Config& config);
  ~PPOTrainer();
  PPOTrainer(const PPOTrainer&) = delete;
  PPOTrainer& operator=(const PPOTrainer&) = delete;

  /// init_model on every role.
  void init_workers();
  /// Validation before training (trainer.val_before_train), the step loop up to
  /// total_training_steps, periodic validation/checkpoints, metrics to console and JSONL.
  /// Resumes from the latest checkpoint when trainer.resume_mode=auto finds one.
  void fit();
  /// Greedy (val_kwargs) generation on the validation set; returns val-core/... metrics.
  nlohmann::json validate();

  /// Metrics of every logged step (validation-only entries included), in order.
  const std::vector<nlohmann::json>& history() const;
  int64_t total_training_steps() const;
  /// Where checkpoints go (trainer.default_local_dir, resolved).
  std::string checkpoint_dir() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The main() of hyflow-ppo / -grpo / -rloo / -reinforce-pp / -remax: verl defaults, then
/// `defaults` (e.g. {"algorithm.adv_estimator", "grpo"}), then the command line. Prints
/// --help; config errors are reported naming the key with exit code 2.
int run_ppo_app(int argc, char** argv, const std::string& program,
                const std::vector<std::pair<std::string, std::string>>& defaults);

}  // namespace hyflow::trainer
