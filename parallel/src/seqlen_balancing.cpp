#include <hyflow/parallel/seqlen_balancing.hpp>

#include <hyflow/core/error.hpp>

#include <algorithm>
#include <numeric>
#include <queue>
#include <utility>

namespace hyflow::parallel::seqlen_balancing {
namespace {

using Item = std::pair<int64_t, int64_t>;  // (index, value), compared in that order

// One partition under construction.
struct Bin {
  int64_t sum = 0;
  std::vector<Item> items;

  void add(int64_t idx, int64_t value) {
    items.emplace_back(idx, value);
    sum += value;
  }
  void absorb(const Bin& other) {
    items.insert(items.end(), other.items.begin(), other.items.end());
    sum += other.sum;
  }
};

// Bins order by sum, then item count, then their items lexicographically.
bool bin_less(const Bin& a, const Bin& b) {
  if (a.sum != b.sum) return a.sum < b.sum;
  if (a.items.size() != b.items.size()) return a.items.size() < b.items.size();
  return a.items < b.items;
}

// k bins, kept in decreasing order.
struct State {
  std::vector<Bin> bins;

  void sort_decreasing() {
    std::stable_sort(bins.begin(), bins.end(), [](const Bin& a, const Bin& b) { return bin_less(b, a); });
  }
  int64_t spread() const { return bins.front().sum - bins.back().sum; }
  // Largest bin takes the other's smallest, and so on.
  void merge(const State& other) {
    const size_t k = bins.size();
    for (size_t i = 0; i < k; ++i) bins[i].absorb(other.bins[k - 1 - i]);
    sort_decreasing();
  }
};

// The state popped first: the larger spread, then the larger biggest bin. Distinct states hold
// distinct indices, so this order is total and the merge sequence does not depend on the heap.
bool pops_before(const State& a, const State& b) {
  const int64_t sa = a.spread(), sb = b.spread();
  if (sa != sb) return sa > sb;
  return bin_less(b.bins.front(), a.bins.front());
}

void check_k(int64_t k, const char* what) {
  if (k < 1) throw ValueError(std::string(what) + ": k_partitions must be at least 1, got " + std::to_string(k));
}

void check_equal_size(size_t n, int64_t k, const char* what) {
  if (n % static_cast<size_t>(k) != 0)
    throw ValueError(std::string(what) + ": equal_size needs the item count " + std::to_string(n) +
                     " to be a multiple of k_partitions " + std::to_string(k));
}

// Even positions, then odd positions reversed: {0, 2, 4, ..., 5, 3, 1}.
std::vector<int64_t> evens_then_reversed_odds(const std::vector<int64_t>& v) {
  const auto n = static_cast<int64_t>(v.size());
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (int64_t i = 0; i < n; i += 2) out.push_back(v[static_cast<size_t>(i)]);
  for (int64_t i = n % 2 == 0 ? n - 1 : n - 2; i >= 1; i -= 2) out.push_back(v[static_cast<size_t>(i)]);
  return out;
}

// Micro-batches by total workload descending (ties: first index, descending), then the even
// positions reversed followed by the odd ones: the heaviest sit in the middle.
template <class WorkloadOf>
std::vector<std::vector<int64_t>> order_by_workload_heaviest_in_middle(std::vector<std::vector<int64_t>> partitions,
                                                                       WorkloadOf workload_of) {
  auto key = [&](const std::vector<int64_t>& p) {
    int64_t s = 0;
    for (int64_t i : p) s += workload_of(i);
    return std::pair(s, p.front());
  };
  std::stable_sort(partitions.begin(), partitions.end(), [&](const auto& a, const auto& b) { return key(b) < key(a); });
  std::vector<std::vector<int64_t>> out;
  out.reserve(partitions.size());
  const auto count = static_cast<int64_t>(partitions.size());
  for (int64_t i = (count - 1) / 2 * 2; i >= 0; i -= 2) out.push_back(std::move(partitions[static_cast<size_t>(i)]));
  for (size_t i = 1; i < partitions.size(); i += 2) out.push_back(std::move(partitions[i]));
  return out;
}

}  // namespace

int64_t calculate_workload(int64_t seqlen) { return 24576 * seqlen + seqlen * seqlen; }

std::vector<int64_t> calculate_workload(const std::vector<int64_t>& seqlens) {
  std::vector<int64_t> out(seqlens.size());
  std::transform(seqlens.begin(), seqlens.end(), out.begin(), [](int64_t s) { return calculate_workload(s); });
  return out;
}

std::vector<std::vector<int64_t>> karmarkar_karp(const std::vector<int64_t>& seqlen_list, int64_t k_partitions,
                                                 bool equal_size) {
  check_k(k_partitions, "karmarkar_karp");
  const size_t n = seqlen_list.size();
  const auto k = static_cast<size_t>(k_partitions);
  if (equal_size) check_equal_size(n, k_partitions, "karmarkar_karp");

  std::vector<Item> sorted;  // (value, index) ascending
  sorted.reserve(n);
  for (size_t i = 0; i < n; ++i) sorted.emplace_back(seqlen_list[i], static_cast<int64_t>(i));
  std::sort(sorted.begin(), sorted.end());

  std::vector<State> states;
  auto seed = [&](size_t first, size_t count) {
    State s;
    s.bins.resize(k);
    for (size_t j = 0; j < count; ++j) s.bins[j].add(sorted[first + j].second, sorted[first + j].first);
    s.sort_decreasing();
    states.push_back(std::move(s));
  };
  if (equal_size) {
    for (size_t off = 0; off < n; off += k) seed(off, k);
  } else {
    for (size_t i = 0; i < n; ++i) seed(i, 1);
  }
  if (states.empty()) return std::vector<std::vector<int64_t>>(k);

  auto later = [&](size_t a, size_t b) { return pops_before(states[b], states[a]); };
  std::priority_queue<size_t, std::vector<size_t>, decltype(later)> heap(later);
  for (size_t i = 0; i < states.size(); ++i) heap.push(i);
  while (heap.size() > 1) {
    const size_t first = heap.top();
    heap.pop();
    const size_t second = heap.top();
    heap.pop();
    states[first].merge(states[second]);
    states[second] = State{};
    heap.push(first);
  }

  std::vector<std::vector<int64_t>> partitions;
  partitions.reserve(k);
  for (const Bin& b : states[heap.top()].bins) {
    std::vector<int64_t> idx;
    idx.reserve(b.items.size());
    for (const auto& [i, v] : b.items) idx.push_back(i);
    partitions.push_back(std::move(idx));
  }
  return partitions;
}

std::vector<std::vector<int64_t>> greedy_partition(const std::vector<int64_t>& seqlen_list, int64_t k_partitions,
                                                   bool equal_size) {
  check_k(k_partitions, "greedy_partition");
  const size_t n = seqlen_list.size();
  if (equal_size) check_equal_size(n, k_partitions, "greedy_partition");
  const int64_t bias = equal_size ? std::accumulate(seqlen_list.begin(), seqlen_list.end(), int64_t{0}) + 1 : 0;
  std::vector<std::vector<int64_t>> partitions(static_cast<size_t>(k_partitions));
  std::vector<int64_t> sums(static_cast<size_t>(k_partitions), 0);
  for (size_t i = 0; i < n; ++i) {
    const auto lightest = static_cast<size_t>(std::min_element(sums.begin(), sums.end()) - sums.begin());
    partitions[lightest].push_back(static_cast<int64_t>(i));
    sums[lightest] += seqlen_list[i] + bias;
  }
  return partitions;
}

std::vector<std::vector<int64_t>> get_seqlen_balanced_partitions(const std::vector<int64_t>& seqlen_list,
                                                                 int64_t k_partitions, bool equal_size) {
  check_k(k_partitions, "get_seqlen_balanced_partitions");
  if (static_cast<int64_t>(seqlen_list.size()) < k_partitions)
    throw ValueError("get_seqlen_balanced_partitions: " + std::to_string(seqlen_list.size()) +
                     " items cannot fill " + std::to_string(k_partitions) + " partitions");
  auto partitions = karmarkar_karp(seqlen_list, k_partitions, equal_size);
  for (size_t i = 0; i < partitions.size(); ++i) {
    if (partitions[i].empty())
      throw ValueError("get_seqlen_balanced_partitions: partition " + std::to_string(i) + " came out empty");
    std::sort(partitions[i].begin(), partitions[i].end());
  }
  return partitions;
}

std::map<std::string, double> log_seqlen_unbalance(const std::vector<int64_t>& seqlen_list,
                                                   const std::vector<std::vector<int64_t>>& partitions,
                                                   const std::string& prefix) {
  const size_t k = partitions.size();
  const size_t n = seqlen_list.size();
  if (k == 0 || n < k)
    throw ValueError("log_seqlen_unbalance: " + std::to_string(n) + " items in " + std::to_string(k) + " partitions");
  const size_t chunk = n / k;
  int64_t min_sum = 0, max_sum = 0, total = 0;
  for (size_t off = 0; off < n; off += chunk) {
    const size_t end = std::min(n, off + chunk);
    const int64_t s = std::accumulate(seqlen_list.begin() + static_cast<std::ptrdiff_t>(off),
                                      seqlen_list.begin() + static_cast<std::ptrdiff_t>(end), int64_t{0});
    min_sum = off == 0 ? s : std::min(min_sum, s);
    max_sum = off == 0 ? s : std::max(max_sum, s);
    total += s;
  }
  int64_t balanced_min = 0, balanced_max = 0;
  for (size_t p = 0; p < k; ++p) {
    int64_t s = 0;
    for (int64_t i : partitions[p]) {
      if (i < 0 || static_cast<size_t>(i) >= n)
        throw ValueError("log_seqlen_unbalance: partition " + std::to_string(p) + " holds index " + std::to_string(i) +
                         " outside [0, " + std::to_string(n) + ")");
      s += seqlen_list[static_cast<size_t>(i)];
    }
    balanced_min = p == 0 ? s : std::min(balanced_min, s);
    balanced_max = p == 0 ? s : std::max(balanced_max, s);
  }
  return {{prefix + "/min", static_cast<double>(min_sum)},
          {prefix + "/max", static_cast<double>(max_sum)},
          {prefix + "/minmax_diff", static_cast<double>(max_sum - min_sum)},
          {prefix + "/balanced_min", static_cast<double>(balanced_min)},
          {prefix + "/balanced_max", static_cast<double>(balanced_max)},
          {prefix + "/mean", static_cast<double>(total) / static_cast<double>(k)}};
}

std::vector<std::vector<int64_t>> balance_batch_partitions(const std::vector<int64_t>& workloads, int64_t world_size) {
  auto partitions = get_seqlen_balanced_partitions(workloads, world_size, /*equal_size=*/true);
  for (auto& p : partitions) {
    std::stable_sort(p.begin(), p.end(), [&](int64_t a, int64_t b) {
      return std::pair(workloads[static_cast<size_t>(a)], a) < std::pair(workloads[static_cast<size_t>(b)], b);
    });
    p = evens_then_reversed_odds(p);
  }
  return partitions;
}

std::vector<std::vector<int64_t>> dynamic_micro_batch_partitions(const std::vector<int64_t>& workloads,
                                                                 int64_t num_micro_batches) {
  auto partitions = get_seqlen_balanced_partitions(workloads, num_micro_batches, /*equal_size=*/false);
  return order_by_workload_heaviest_in_middle(std::move(partitions),
                                              [&](int64_t i) { return workloads[static_cast<size_t>(i)]; });
}

std::vector<std::vector<int64_t>> rearrange_micro_batches(const std::vector<int64_t>& seq_len_effective,
                                                          int64_t max_token_len, int64_t padded_seq_len,
                                                          const RearrangeOptions& options) {
  if (max_token_len < padded_seq_len)
    throw ValueError("rearrange_micro_batches: max_token_len " + std::to_string(max_token_len) +
                     " is below the sequence length " + std::to_string(padded_seq_len));
  const int64_t group = options.force_group_size;
  const auto rows = static_cast<int64_t>(seq_len_effective.size());
  if (group < 1 || rows % group != 0)
    throw ValueError("rearrange_micro_batches: batch size " + std::to_string(rows) +
                     " is not a multiple of force_group_size " + std::to_string(group));
  const int64_t num_groups = rows / group;
  const int64_t total = std::accumulate(seq_len_effective.begin(), seq_len_effective.end(), int64_t{0});
  int64_t count = std::min(num_groups, ceildiv(total, max_token_len));
  if (options.min_num_micro_batch) count = std::max(*options.min_num_micro_batch, count);
  if (options.sync_num_micro_batches) count = options.sync_num_micro_batches(count);
  if (options.num_batches_divided_by) count = roundup_divisible(count, *options.num_batches_divided_by);
  if (count < 1 || count > num_groups)
    throw ValueError("rearrange_micro_batches: " + std::to_string(count) + " micro-batches for " +
                     std::to_string(num_groups) + " groups of " + std::to_string(group) + " rows");

  // One workload per group: the sum over its rows.
  std::vector<int64_t> workloads(static_cast<size_t>(num_groups), 0);
  for (int64_t r = 0; r < rows; ++r)
    workloads[static_cast<size_t>(r / group)] += calculate_workload(seq_len_effective[static_cast<size_t>(r)]);
  auto partitions = get_seqlen_balanced_partitions(workloads, count, /*equal_size=*/false);
  for (auto& p : partitions) {  // group indices -> row indices
    std::vector<int64_t> row_idx;
    row_idx.reserve(p.size() * static_cast<size_t>(group));
    for (int64_t g : p)
      for (int64_t r = g * group; r < (g + 1) * group; ++r) row_idx.push_back(r);
    p = std::move(row_idx);
  }
  if (!options.use_dynamic_bsz_balance) return partitions;
  // Each group counts once, through its first row.
  return order_by_workload_heaviest_in_middle(
      std::move(partitions), [&](int64_t r) { return r % group == 0 ? workloads[static_cast<size_t>(r / group)] : 0; });
}

int64_t ceildiv(int64_t a, int64_t b) {
  if (b <= 0) throw ValueError("ceildiv: divisor must be positive, got " + std::to_string(b));
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

int64_t roundup_divisible(int64_t a, int64_t b) {
  if (b <= 0) throw ValueError("roundup_divisible: divisor must be positive, got " + std::to_string(b));
  return ceildiv(a, b) * b;
}

}  // namespace hyflow::parallel::seqlen_balancing
