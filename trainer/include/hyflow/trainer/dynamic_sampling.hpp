#pragma once
// DAPO's dynamic sampling (verl's algorithm.filter_groups): each generated and scored batch
// keeps only the prompt groups (rows sharing a uid) whose filter metric is not the same for all
// their samples (a group of one sample is kept); kept groups accumulate over generation batches
// until data.train_batch_size prompts are kept, and the step trains on exactly the first
// train_batch_size groups (train_batch_size x rollout.n rows). See docs/trainer.md.

#include <hyflow/dataproto/data_proto.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace hyflow::trainer {

/// Per-row values of a filter metric: "seq_reward" sums token_level_scores, "seq_final_reward"
/// sums token_level_rewards (token_level_scores when the batch has no rewards yet), any other
/// name is a numeric (or boolean) non-tensor column, e.g. the reward manager's "acc" or "score".
/// A missing column or a non-numeric value: KeyError / ValueError naming
/// algorithm.filter_groups.metric.
std::vector<double> filter_metric_values(const DataProto& batch, const std::string& metric);

/// Row indices (in row order) of the groups, by `uids`, whose `values` are not all equal, and of
/// the groups of a single row. ShapeError when the sizes differ.
std::vector<int64_t> kept_group_rows(const std::vector<std::string>& uids, const std::vector<double>& values);

/// Accumulates the kept groups of successive generation batches of one training step.
class DynamicSampler {
 public:
  /// `max_num_gen_batches` <= 0: no limit. `n` rows per prompt (rollout.n).
  DynamicSampler(int64_t train_batch_size, int64_t n, int64_t max_num_gen_batches);

  /// Adds one scored generation batch (rows interleaved per prompt, with a "uid" column) and
  /// the per-row filter metric values; returns how many prompts of it were kept. When the
  /// batch is still short of train_batch_size prompts after max_num_gen_batches generation
  /// batches: ValueError naming algorithm.filter_groups.max_num_gen_batches.
  int64_t add(const DataProto& scored, const std::vector<double>& metric_values);
  /// train_batch_size prompts or more are kept.
  bool full() const { return num_prompts_ >= train_batch_size_; }
  /// Generation batches added since the last take().
  int64_t num_gen_batches() const { return num_gen_batches_; }
  /// Prompts kept since the last take().
  int64_t num_prompts() const { return num_prompts_; }
  /// The first train_batch_size kept groups (train_batch_size x n rows, in generation order);
  /// the groups beyond them are dropped, as in verl. Resets the sampler. Error unless full().
  DataProto take();

 private:
  int64_t train_batch_size_, n_, max_num_gen_batches_;
  int64_t num_gen_batches_ = 0, num_prompts_ = 0;
  std::vector<DataProto> kept_;
};

}  // namespace hyflow::trainer
