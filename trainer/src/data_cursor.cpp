#include "data_cursor.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/trainer/dataset.hpp>

#include <string>

namespace hyflow::trainer {

DataCursor::DataCursor(int64_t dataset_size, int64_t gen_batch_size, bool shuffle, uint64_t seed,
                       std::optional<int64_t> budget_epochs)
    : dataset_size_(dataset_size),
      gen_batch_size_(gen_batch_size),
      batches_per_epoch_(dataset_size / gen_batch_size),  // drop_last
      shuffle_(shuffle),
      seed_(seed) {
  if (batches_per_epoch_ == 0)
    throw ValueError("config key 'data.gen_batch_size' (" + std::to_string(gen_batch_size) +
                     ") exceeds the training set (" + std::to_string(dataset_size) + " rows)");
  if (budget_epochs) budget_ = batches_per_epoch_ * *budget_epochs;
}

std::optional<std::vector<int64_t>> DataCursor::next(int64_t& epoch) {
  if (!has_next()) return std::nullopt;
  epoch = position_ / batches_per_epoch_;
  const int64_t b = position_ % batches_per_epoch_;
  if (epoch != order_epoch_) {
    order_ = epoch_order(dataset_size_, shuffle_, seed_, epoch);
    order_epoch_ = epoch;
  }
  ++position_;
  return std::vector<int64_t>(order_.begin() + b * gen_batch_size_, order_.begin() + (b + 1) * gen_batch_size_);
}

}  // namespace hyflow::trainer
