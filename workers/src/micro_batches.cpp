#include <hyflow/workers/micro_batches.hpp>

#include <hyflow/parallel/process_group.hpp>
#include <hyflow/parallel/seqlen_balancing.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <numeric>

namespace hyflow::workers {

MicroBatches make_micro_batches(const DataProto& data, const ForwardBatching& batching, const std::string& what,
                                parallel::ProcessGroup* agree) {
  MicroBatches out;
  const int64_t rows = data.size();
  if (rows == 0) return out;
  if (!batching.use_dynamic_bsz) {
    out.batches = data.split(batching.micro_batch_size_per_gpu.value_or(rows));
    return out;
  }
  if (!data.batch.contains("attention_mask"))
    throw KeyError(what + ": dynamic batch size needs the tensor 'attention_mask'");
  auto lengths_t = data.batch.at("attention_mask").sum(-1).to(torch::kLong).contiguous();
  std::vector<int64_t> lengths(lengths_t.data_ptr<int64_t>(), lengths_t.data_ptr<int64_t>() + rows);
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  if (longest > batching.max_token_len_per_gpu)
    throw ValueError(what + ": a row has " + std::to_string(longest) + " tokens, more than max_token_len_per_gpu " +
                     std::to_string(batching.max_token_len_per_gpu));
  const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  int64_t parts =
      std::clamp<int64_t>(parallel::seqlen_balancing::ceildiv(total, batching.max_token_len_per_gpu), 1, rows);
  if (agree) {  // ranks hold equally many rows (DP_COMPUTE_PROTO pads), so the largest count fits all
    auto count = torch::tensor({parts}, torch::kLong);
    agree->all_reduce(count, parallel::ReduceOp::max);
    parts = std::min(count.item<int64_t>(), rows);
  }
  for (auto& group : parallel::seqlen_balancing::dynamic_micro_batch_partitions(
           parallel::seqlen_balancing::calculate_workload(lengths), parts)) {
    out.batches.push_back(data.select_idxs(group));
    out.order.insert(out.order.end(), group.begin(), group.end());
  }
  return out;
}

DataProto restore_order(const DataProto& concatenated, const std::vector<int64_t>& order) {
  if (order.empty()) return concatenated;
  if (static_cast<int64_t>(order.size()) != concatenated.size())
    throw ShapeError("restore_order: " + std::to_string(order.size()) + " indices for " +
                     std::to_string(concatenated.size()) + " rows");
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return concatenated.select_idxs(inverse);
}

int64_t normalized_mini_batch_size(int64_t ppo_mini_batch_size, int64_t rollout_n, int64_t world_size,
                                   const std::optional<int64_t>& micro_batch_size, const std::string& path) {
  const int64_t samples = ppo_mini_batch_size * rollout_n;
  if (samples % world_size != 0)
    throw ValueError("config key '" + path + "': ppo_mini_batch_size " + std::to_string(ppo_mini_batch_size) +
                     " x rollout.n " + std::to_string(rollout_n) + " = " + std::to_string(samples) +
                     " does not divide over " + std::to_string(world_size) + " workers");
  const int64_t per_rank = samples / world_size;
  if (micro_batch_size && per_rank % *micro_batch_size != 0)
    throw ValueError("config key '" + path + "': the per-worker mini-batch of " + std::to_string(per_rank) +
                     " rows is not a multiple of the micro-batch size " + std::to_string(*micro_batch_size));
  return per_rank;
}

}  // namespace hyflow::workers
