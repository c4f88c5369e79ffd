// Sequence balancing: values derived by hand from the Karmarkar–Karp rules (verl's
// seqlen_balancing semantics: states ordered by spread, then by their largest bin).
#include <hyflow/core/error.hpp>
#include <hyflow/parallel/seqlen_balancing.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

using namespace hyflow::parallel::seqlen_balancing;
using Parts = std::vector<std::vector<int64_t>>;

TEST_CASE("calculate_workload is 24576*s + s^2") {
  CHECK(calculate_workload(int64_t{10}) == 245860);
  CHECK(calculate_workload(std::vector<int64_t>{0, 1, 2}) == std::vector<int64_t>{0, 24577, 49156});
}

TEST_CASE("karmarkar_karp of {5,3,8,1} into 2 merges largest spreads first") {
  // 8|5 -> {8},{5}; then spread-3 tie broken by the larger top bin: {8},{5} before {3};
  // -> {5,3},{8}; then {1} with it -> {1,8}=9, {5,3}=8.
  CHECK(karmarkar_karp({5, 3, 8, 1}, 2, false) == Parts{{3, 2}, {0, 1}});
  CHECK(get_seqlen_balanced_partitions({5, 3, 8, 1}, 2, false) == Parts{{2, 3}, {0, 1}});
}

TEST_CASE("karmarkar_karp equal_size seeds k-sets from consecutive sorted items") {
  // sorted (1,2) (3,4) (5,6) -> states of spread 1; {6,5} and {4,3} merge to {6,3},{5,4};
  // equal sums, equal sizes: ordered by items, so {5,4} first; then {2,1}: {2,6,3}=11, {1,5,4}=10.
  const std::vector<int64_t> lens{4, 1, 3, 2, 6, 5};
  CHECK(karmarkar_karp(lens, 2, true) == Parts{{3, 4, 2}, {1, 5, 0}});
  CHECK(get_seqlen_balanced_partitions(lens, 2, true) == Parts{{2, 3, 4}, {0, 1, 5}});
}

TEST_CASE("karmarkar_karp into 3 partitions of 5 items") {
  CHECK(get_seqlen_balanced_partitions({5, 3, 8, 1, 2}, 3, false) == Parts{{2}, {0, 3}, {1, 4}});
}

TEST_CASE("balance_batch_partitions sorts each rank by workload, then evens and reversed odds") {
  // partitions {2,3,4} (3,2,6) and {0,1,5} (4,1,5): by workload 3,2,4 -> 3,4,2 and 1,0,5 -> 1,5,0
  CHECK(balance_batch_partitions({4, 1, 3, 2, 6, 5}, 2) == Parts{{3, 4, 2}, {1, 5, 0}});
}

TEST_CASE("dynamic_micro_batch_partitions puts the heavier micro-batches in the middle") {
  // KK: {2}=8, {0,3}=6, {1,4}=5; descending order keeps that; evens reversed then odds
  CHECK(dynamic_micro_batch_partitions({5, 3, 8, 1, 2}, 3) == Parts{{1, 4}, {2}, {0, 3}});
  CHECK(dynamic_micro_batch_partitions({5, 3, 8, 1}, 2) == Parts{{2, 3}, {0, 1}});
  CHECK(dynamic_micro_batch_partitions({7}, 1) == Parts{{0}});
}

TEST_CASE("log_seqlen_unbalance compares consecutive chunks with the partitions") {
  const auto m = log_seqlen_unbalance({4, 1, 3, 2, 6, 5}, {{2, 3, 4}, {0, 1, 5}}, "global_seqlen");
  CHECK(m.at("global_seqlen/min") == 8);
  CHECK(m.at("global_seqlen/max") == 13);
  CHECK(m.at("global_seqlen/minmax_diff") == 5);
  CHECK(m.at("global_seqlen/balanced_min") == 10);
  CHECK(m.at("global_seqlen/balanced_max") == 11);
  CHECK(m.at("global_seqlen/mean") == 10.5);
}

TEST_CASE("greedy_partition fills the lightest partition in index order") {
  CHECK(greedy_partition({5, 3, 8, 1}, 2, false) == Parts{{0, 3}, {1, 2}});
  CHECK(greedy_partition({9, 1, 1, 1}, 2, true) == Parts{{0, 3}, {1, 2}});
}

TEST_CASE("random batches: every index once, equal sizes, spread no worse than a round robin") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t k = 1 + static_cast<int64_t>(rng() % 8);
    const int64_t per = 1 + static_cast<int64_t>(rng() % 6);
    std::vector<int64_t> lens(static_cast<size_t>(k * per));
    for (auto& l : lens) l = calculate_workload(1 + static_cast<int64_t>(rng() % 300));
    const auto parts = get_seqlen_balanced_partitions(lens, k, true);
    REQUIRE(static_cast<int64_t>(parts.size()) == k);
    std::set<int64_t> seen;
    int64_t lo = INT64_MAX, hi = 0;
    for (const auto& p : parts) {
      CHECK(static_cast<int64_t>(p.size()) == per);
      CHECK(std::is_sorted(p.begin(), p.end()));
      int64_t s = 0;
      for (int64_t i : p) {
        seen.insert(i);
        s += lens[static_cast<size_t>(i)];
      }
      lo = std::min(lo, s);
      hi = std::max(hi, s);
    }
    CHECK(static_cast<int64_t>(seen.size()) == k * per);
    // the largest item bounds how far apart KK's sums can end up with one item per seed row
    CHECK(hi - lo <= *std::max_element(lens.begin(), lens.end()));
  }
}

TEST_CASE("bad partition requests are ValueErrors naming the counts") {
  CHECK_THROWS_AS(karmarkar_karp({1, 2, 3}, 0, false), hyflow::ValueError);
  CHECK_THROWS_WITH(karmarkar_karp({1, 2, 3, 4, 5}, 2, true), Catch::Contains("5") && Catch::Contains("2"));
  CHECK_THROWS_WITH(get_seqlen_balanced_partitions({1, 2}, 3, false), Catch::Contains("2 items"));
  CHECK_THROWS_AS(log_seqlen_unbalance({1}, {{0}, {}}, "x"), hyflow::ValueError);
  CHECK_THROWS_AS(log_seqlen_unbalance({1, 2}, {{0}, {5}}, "x"), hyflow::ValueError);
}

TEST_CASE("rearrange_micro_batches: count from the token budget, KK partition, optional balancing order") {
  // Σ = 19 tokens, budget 8: 3 micro-batches. Workloads 24576·s + s² keep the lengths' order:
  // KK pairs 8 with 5 and 3, then 2 joins {3}, then 1 joins {3,2}: {8}, {3,2,1}, {5}.
  const std::vector<int64_t> lens{5, 3, 8, 1, 2};
  RearrangeOptions kk_order;
  kk_order.use_dynamic_bsz_balance = false;
  CHECK(rearrange_micro_batches(lens, 8, 8, kk_order) == Parts{{2}, {1, 3, 4}, {0}});
  // balanced: by workload descending {8}, {3,2,1}, {5}; evens reversed, then odds
  CHECK(rearrange_micro_batches(lens, 8, 8) == Parts{{0}, {2}, {1, 3, 4}});
  CHECK(rearrange_micro_batches(lens, 8, 8) == dynamic_micro_batch_partitions(calculate_workload(lens), 3));
  // pairs of rows stay together
  RearrangeOptions pairs = kk_order;
  pairs.force_group_size = 2;
  CHECK(rearrange_micro_batches({5, 3, 8, 1, 2, 4}, 8, 8, pairs) == Parts{{2, 3}, {0, 1}, {4, 5}});
  // 3 micro-batches rounded up to a multiple of 4 (virtual pipeline size)
  RearrangeOptions vpp = kk_order;
  vpp.num_batches_divided_by = 4;
  CHECK(rearrange_micro_batches({5, 3, 8, 1}, 8, 8, vpp).size() == 4);
  // the count agreed with the other ranks is used
  RearrangeOptions synced;
  synced.sync_num_micro_batches = [](int64_t n) { return n + 1; };
  CHECK(rearrange_micro_batches(lens, 8, 8, synced).size() == 4);
}

TEST_CASE("rearrange_micro_batches refuses what verl asserts against") {
  CHECK_THROWS_WITH(rearrange_micro_batches({1, 2}, 4, 5), Catch::Contains("max_token_len 4"));
  RearrangeOptions pairs;
  pairs.force_group_size = 2;
  CHECK_THROWS_WITH(rearrange_micro_batches({1, 2, 3}, 8, 8, pairs), Catch::Contains("force_group_size 2"));
  RearrangeOptions too_many;
  too_many.min_num_micro_batch = 3;
  CHECK_THROWS_AS(rearrange_micro_batches({1, 2}, 8, 8, too_many), hyflow::ValueError);
  CHECK_THROWS_AS(rearrange_micro_batches({}, 8, 8), hyflow::ValueError);
}

TEST_CASE("roundup_divisible rounds up to a multiple") {
  CHECK(roundup_divisible(7, 4) == 8);
  CHECK(roundup_divisible(8, 4) == 8);
  CHECK(roundup_divisible(0, 4) == 0);
  CHECK(roundup_divisible(-5, 4) == -4);
  CHECK_THROWS_AS(roundup_divisible(1, 0), hyflow::ValueError);
}

TEST_CASE("ceildiv rounds up") {
  CHECK(ceildiv(7, 3) == 3);
  CHECK(ceildiv(6, 3) == 2);
  CHECK(ceildiv(0, 3) == 0);
  CHECK_THROWS_AS(ceildiv(1, 0), hyflow::ValueError);
}
