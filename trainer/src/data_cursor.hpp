#pragma once
// DataCursor: the trainer's position in its training data, counted in generation batches over
// all epochs (epoch = position / batches per epoch, verl's drop_last dataloader). Every epoch
// takes the rows in epoch_order (shuffled per epoch from the seed). A checkpoint records the
// position; resuming seeks to it.

#include <cstdint>
#include <optional>
#include <vector>

namespace hyflow::trainer {

class DataCursor {
 public:
  /// `budget_epochs`: the data of that many epochs, then nothing (null: endless, the run stops
  /// at trainer.total_training_steps). ValueError naming data.gen_batch_size when one
  /// generation batch exceeds the data set.
  DataCursor(int64_t dataset_size, int64_t gen_batch_size, bool shuffle, uint64_t seed,
             std::optional<int64_t> budget_epochs);

  /// The rows of the next generation batch and its epoch; null once the budget is spent.
  std::optional<std::vector<int64_t>> next(int64_t& epoch);
  /// Whether next() would return rows.
  bool has_next() const { return !budget_ || position_ < *budget_; }

  /// Generation batches taken so far (what a checkpoint records).
  int64_t position() const { return position_; }
  void seek(int64_t position) { position_ = position; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t gen_batch_size() const { return gen_batch_size_; }

 private:
  int64_t dataset_size_, gen_batch_size_, batches_per_epoch_;
  bool shuffle_;
  uint64_t seed_;
  std::optional<int64_t> budget_;  // generation batches
  int64_t position_ = 0;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace hyflow::trainer
