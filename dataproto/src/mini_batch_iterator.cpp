#include <hyflow/dataproto/data_proto.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <numeric>
#include <random>

namespace hyflow::dataproto {

MiniBatchIterator::MiniBatchIterator(DataProto data, MiniBatchOptions options)
    : data_(std::move(data)), options_(options) {
  if (options_.mini_batch_size <= 0)
    throw ValueError("make_iterator: mini_batch_size must be positive, got " +
                     std::to_string(options_.mini_batch_size));
  if (options_.epochs < 0)
    throw ValueError("make_iterator: epochs must be >= 0, got " + std::to_string(options_.epochs));
  if (data_.size() % options_.mini_batch_size != 0)
    throw ShapeError("make_iterator: batch of " + std::to_string(data_.size()) +
                     " rows is not a multiple of mini_batch_size " + std::to_string(options_.mini_batch_size));
  if (options_.shuffle) {
    const uint64_t seed = options_.seed ? *options_.seed : std::random_device{}();
    generator_ = at::make_generator<at::CPUGeneratorImpl>(seed);
  }
  start_epoch();
}

int64_t MiniBatchIterator::batches_per_epoch() const { return data_.size() / options_.mini_batch_size; }

void MiniBatchIterator::start_epoch() {
  position_ = 0;
  const int64_t n = data_.size();
  if (generator_) {
    const at::Tensor perm = at::randperm(n, *generator_, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    order_.assign(p, p + n);
  } else {
    order_.resize(static_cast<size_t>(n));
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
}

std::optional<DataProto> MiniBatchIterator::next() {
  if (position_ >= data_.size()) {
    ++epoch_;
    if (epoch_ >= options_.epochs) return std::nullopt;
    start_epoch();
  }
  if (epoch_ >= options_.epochs || data_.size() == 0) return std::nullopt;
  const auto begin = order_.begin() + position_;
  std::vector<int64_t> idx(begin, begin + options_.mini_batch_size);
  position_ += options_.mini_batch_size;
  if (!options_.shuffle) return data_.slice(idx.front(), idx.back() + 1);  // contiguous: a view
  return data_.select_idxs(idx);
}

}  // namespace hyflow::dataproto
