#pragma once
// Reward managers (verl's workers/reward_manager): decode each rollout row, score it with a
// compute_score function and put the score at the last valid response token.
//   naive — one compute_score call per row;
//   dapo  — like naive, trailing eos text stripped, optional overlong penalty;
//   batch — one call over the whole batch.
// A batch that already carries "rm_scores" (reward model) is returned as is.

#include <hyflow/algos/reward_score.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/tokenizers/tokenizer.hpp>

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::trainer {

struct RewardOutput {
  at::Tensor reward_tensor;  ///< float32 (B, T), score at valid_response_length - 1
  std::map<std::string, std::vector<nlohmann::json>> reward_extra_info;  ///< one value per row
};

/// A batched reward function (verl's batch manager): one result per row.
using BatchComputeScoreFn = std::function<std::vector<algos::reward_score::ScoreResult>(
    const std::vector<std::string>& data_sources, const std::vector<std::string>& solution_strs,
    const std::vector<nlohmann::json>& ground_truths, const std::vector<nlohmann::json>& extra_infos)>;

/// Registers a batch reward function by name (ValueError when taken, unless overwrite).
void register_batch_compute_score(const std::string& name, BatchComputeScoreFn fn, bool overwrite = false);
/// KeyError naming the unknown name.
BatchComputeScoreFn get_batch_compute_score(const std::string& name);

/// Loads a shared library of reward functions (`custom_reward_function.path`): its static
/// initializers call register_compute_score / register_batch_compute_score, and
/// `custom_reward_function.name` then picks one. The library is not linked against hyflow: it
/// resolves those functions in the program, which must export its symbols (the hyflow-* apps
/// do; CMake: ENABLE_EXPORTS). ValueError naming the path (and dlerror()) when it cannot be
/// loaded; loading the same file again does nothing.
void load_reward_plugin(const std::string& path);

struct RewardSection;
/// custom_reward_function as verl resolves it: without a path, compute_score means the default
/// router; with one, the plugin is loaded and the name must then be a registered (batch, for the
/// batch manager) reward function. Returns the function's registered name; ValueError / KeyError
/// naming custom_reward_function.path / .name.
std::string load_custom_reward_function(const RewardSection& reward);

struct OverlongBuffer {
  bool enable = false;
  int64_t len = 0;
  double penalty_factor = 1.0;
};

struct RewardManagerOptions {
  std::string name = "naive";                ///< naive | dapo | batch
  std::string compute_score = "default";     ///< a registered (batch) reward function name
  int64_t num_examine = 0;                   ///< rows printed per data source
  int64_t max_response_length = 0;           ///< dapo overlong buffer
  OverlongBuffer overlong_buffer;
};

class RewardManager {
 public:
  RewardManager(std::shared_ptr<const tokenizers::Tokenizer> tokenizer, RewardManagerOptions options);
  /// Needs responses, prompts, attention_mask and non-tensor data_source, reward_model
  /// ({"ground_truth"}); extra_info optional. KeyError naming a missing column. An agent rollout
  /// (a __num_turns__ column and a response_mask) is scored on the model's last turn: the response
  /// ids after the last one with response_mask 0 (a tool or user turn), so a tool's output is
  /// never taken for the answer; a trajectory that ends on a tool turn scores an empty answer.
  RewardOutput operator()(const DataProto& data) const;
  const RewardManagerOptions& options() const { return options_; }

 private:
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer_;
  RewardManagerOptions options_;
};

}  // namespace hyflow::trainer
