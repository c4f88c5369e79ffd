#pragma once
// Mini- and micro-batching of a rank's data (verl's data.split and rearrange_micro_batches).

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/workers/config.hpp>

#include <cstdint>
#include <vector>

namespace hyflow::parallel {
class ProcessGroup;
}

namespace hyflow::workers {

/// Micro-batches of one batch. With dynamic batch size the rows are regrouped: `order[i]` is
/// the input row that sits at position i of the concatenated micro-batches.
struct MicroBatches {
  std::vector<DataProto> batches;
  std::vector<int64_t> order;  ///< empty: rows keep their order
};

/// Fixed size: consecutive pieces of micro_batch_size_per_gpu rows (the whole batch when
/// unset). Dynamic (verl's rearrange_micro_batches): min(rows, ceil(Σ tokens / max_token_len))
/// micro-batches, a Karmarkar–Karp partition of the rows' workloads (tokens = attention_mask
/// row sums; parallel::seqlen_balancing::dynamic_micro_batch_partitions); ValueError when one row alone
/// exceeds max_token_len, naming `what`. With `agree` (sharded models: every micro-batch's forward
/// is a collective), the dynamic count is the largest over the group's ranks, so all run as many.
MicroBatches make_micro_batches(const DataProto& data, const ForwardBatching& batching, const std::string& what,
                                parallel::ProcessGroup* agree = nullptr);

/// Puts rows of `concatenated` (micro-batch order) back into input order.
DataProto restore_order(const DataProto& concatenated, const std::vector<int64_t>& order);

/// Rows per rank of a mini-batch: ppo_mini_batch_size (prompts) × rollout_n ÷ world_size;
/// ValueError naming `path` when it does not divide evenly or is not a multiple of the micro
/// batch size.
int64_t normalized_mini_batch_size(int64_t ppo_mini_batch_size, int64_t rollout_n, int64_t world_size,
                                   const std::optional<int64_t>& micro_batch_size, const std::string& path);

}  // namespace hyflow::workers
