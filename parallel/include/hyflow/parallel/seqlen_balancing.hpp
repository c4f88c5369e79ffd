#pragma once
// Sequence-length balancing (verl.utils.seqlen_balancing): partitions of rows with balanced
// workloads, for spreading a batch over data-parallel ranks and for dynamic micro-batches.
// Same algorithms, tie-breaking and results as verl's Python functions of the same names.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::parallel::seqlen_balancing {

/// Workload estimate of a dense transformer on a sequence of `seqlen` tokens:
/// 24576·s + s² (12·h²·s + 2·h·s² for h = 4096, divided by 2·h).
int64_t calculate_workload(int64_t seqlen);
std::vector<int64_t> calculate_workload(const std::vector<int64_t>& seqlens);

/// Karmarkar–Karp largest differencing into `k_partitions` sets. Items are sorted ascending
/// by (value, index); with `equal_size` each run of k consecutive items seeds one k-set state
/// (every partition then gets n/k items), otherwise each item is its own state. The two states
/// with the largest spread (ties: the larger biggest set) are merged, largest set with smallest,
/// until one remains. Partitions come in that state's order (largest sum first), with indices
/// in insertion order. ValueError when k < 1, or `equal_size` and n % k != 0.
std::vector<std::vector<int64_t>> karmarkar_karp(const std::vector<int64_t>& seqlen_list, int64_t k_partitions,
                                                 bool equal_size);

/// Greedy: items in index order, each into the partition with the smallest sum (first on
/// ties); `equal_size` adds a bias of Σ+1 to every item so the counts stay equal.
std::vector<std::vector<int64_t>> greedy_partition(const std::vector<int64_t>& seqlen_list, int64_t k_partitions,
                                                   bool equal_size);

/// karmarkar_karp with every partition's indices sorted ascending. ValueError when there are
/// fewer items than partitions, a partition comes out empty, or `equal_size` cannot hold.
std::vector<std::vector<int64_t>> get_seqlen_balanced_partitions(const std::vector<int64_t>& seqlen_list,
                                                                 int64_t k_partitions, bool equal_size);

/// verl's balance metrics: `{prefix}/min`, `/max`, `/minmax_diff` over consecutive chunks of
/// n/k items in the original order; `/balanced_min`, `/balanced_max` over the partitions;
/// `/mean` = Σ / k.
std::map<std::string, double> log_seqlen_unbalance(const std::vector<int64_t>& seqlen_list,
                                                   const std::vector<std::vector<int64_t>>& partitions,
                                                   const std::string& prefix);

/// The rows of each data-parallel rank for trainer.balance_batch: KK equal-size partition of
/// the workloads into `world_size` ranks, each partition sorted by (workload, index) and then
/// laid out as its even positions followed by its odd positions reversed (small rows at both
/// ends). Concatenating the result gives the batch's new row order.
std::vector<std::vector<int64_t>> balance_batch_partitions(const std::vector<int64_t>& workloads, int64_t world_size);

/// The micro-batches of dynamic batch size with verl's default balancing: KK partition (not
/// equal size) of the workloads into `num_micro_batches`, then ordered by total workload
/// descending (ties: first index, descending), then laid out as the even positions reversed
/// followed by the odd positions (smaller micro-batches at both ends).
std::vector<std::vector<int64_t>> dynamic_micro_batch_partitions(const std::vector<int64_t>& workloads,
                                                                 int64_t num_micro_batches);

/// Options of rearrange_micro_batches (verl's keyword arguments).
struct RearrangeOptions {
  /// Round the micro-batch count up to a multiple of this (virtual pipeline size).
  std::optional<int64_t> num_batches_divided_by;
  /// At least this many micro-batches.
  std::optional<int64_t> min_num_micro_batch;
  /// Order the micro-batches by workload, heaviest in the middle; false keeps KK's order.
  bool use_dynamic_bsz_balance = true;
  /// Keep runs of this many consecutive rows in one micro-batch.
  int64_t force_group_size = 1;
  /// Agrees on the count across data-parallel ranks before rounding (verl: all-reduce MAX over
  /// dp_group when same_micro_num_in_dp); empty: the local count is used.
  std::function<int64_t(int64_t)> sync_num_micro_batches;
};

/// verl's rearrange_micro_batches on the rows' effective lengths (attention_mask row sums),
/// returning the row indices of each micro-batch. Count: min(groups, ceil(Σ lengths /
/// max_token_len)), raised to min_num_micro_batch, synced, rounded up to a multiple of
/// num_batches_divided_by. Groups of force_group_size rows are partitioned by Karmarkar–Karp
/// on their summed workloads (get_seqlen_balanced_partitions, not equal size, indices
/// ascending); with use_dynamic_bsz_balance the micro-batches are then ordered as in
/// dynamic_micro_batch_partitions. ValueError when `padded_seq_len` (the attention mask's
/// width) exceeds max_token_len, the row count is not a multiple of force_group_size, or the
/// count is 0 or above the number of groups.
std::vector<std::vector<int64_t>> rearrange_micro_batches(const std::vector<int64_t>& seq_len_effective,
                                                          int64_t max_token_len, int64_t padded_seq_len,
                                                          const RearrangeOptions& options = {});

/// ceil(a / b) for b > 0.
int64_t ceildiv(int64_t a, int64_t b);

/// The smallest multiple of b that is >= a (Python's ((a + b - 1) // b) * b), for b > 0.
int64_t roundup_divisible(int64_t a, int64_t b);

}  // namespace hyflow::parallel::seqlen_balancing
