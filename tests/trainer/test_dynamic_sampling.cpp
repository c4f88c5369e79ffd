// DAPO dynamic sampling (algorithm.filter_groups) on hand-made scored batches: which groups are
// kept, accumulation over generation batches, the exact size of the trained batch and the
// max_num_gen_batches error.
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/dynamic_sampling.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

using namespace hyflow;
using namespace hyflow::trainer;
using hyflow::dataproto::Column;
using hyflow::dataproto::NonTensorBatch;

namespace {
/// A scored generation batch: `rewards[p]` are the n rewards of prompt p (uid "<tag>-p"), rows
/// interleaved per prompt; "row" numbers the rows, token_level_scores puts the reward in the
/// last of 3 columns, the "acc" column holds reward > 0.
DataProto scored(const std::string& tag, const std::vector<std::vector<double>>& rewards) {
  Column uid, acc;
  std::vector<float> flat;
  for (size_t p = 0; p < rewards.size(); ++p)
    for (double r : rewards[p]) {
      uid.emplace_back(tag + "-" + std::to_string(p));
      acc.emplace_back(r > 0);
      flat.push_back(static_cast<float>(r));
    }
  const auto rows = static_cast<int64_t>(flat.size());
  auto scores = torch::zeros({rows, 3});
  scores.select(1, 2).copy_(torch::tensor(flat));
  NonTensorBatch nt;
  nt["uid"] = uid;
  nt["acc"] = acc;
  return DataProto::from_dict(TensorDict{{"token_level_scores", scores}, {"row", torch::arange(rows)}}, nt);
}

std::vector<std::string> uids_of(const DataProto& d) {
  std::vector<std::string> out;
  for (const auto& u : d.non_tensor_batch.at("uid")) out.push_back(u.get<std::string>());
  return out;
}
}  // namespace

TEST_CASE("filter_groups keeps groups whose metric differs and groups of one sample, drops all-equal groups") {
  const std::vector<std::string> uids = {"a", "a", "b", "b", "c", "d", "d", "d", "e", "e"};
  const std::vector<double> values = {1, 1, 0, 1, 0, 0.5, 0.5, 0.25, 0, 0};
  // a: all 1 (dropped), b: 0/1 (kept), c: one sample (kept), d: differs (kept), e: all 0 (dropped)
  CHECK(kept_group_rows(uids, values) == std::vector<int64_t>{2, 3, 4, 5, 6, 7});
  CHECK_THROWS_AS(kept_group_rows(uids, {1.0, 2.0}), ShapeError);
}

TEST_CASE("filter metrics: seq_reward sums token_level_scores, other names read a reward_extra_info column") {
  const DataProto d = scored("g", {{1, 0}, {0.5, 0.5}});
  CHECK(filter_metric_values(d, "seq_reward") == std::vector<double>{1, 0, 0.5, 0.5});
  CHECK(filter_metric_values(d, "seq_final_reward") == std::vector<double>{1, 0, 0.5, 0.5});  // no KL yet
  CHECK(filter_metric_values(d, "acc") == std::vector<double>{1, 0, 1, 1});
  CHECK_THROWS_AS(filter_metric_values(d, "no_such_column"), KeyError);
  CHECK_THROWS_WITH(filter_metric_values(d, "no_such_column"),
                    Catch::Contains("algorithm.filter_groups.metric") && Catch::Contains("no_such_column"));
}

TEST_CASE(
    "dynamic sampling accumulates kept groups until train_batch_size prompts, then trains on exactly "
    "train_batch_size x n rows") {
  DynamicSampler s(/*train_batch_size=*/3, /*n=*/2, /*max_num_gen_batches=*/0);
  // batch 1: one of three prompts has differing rewards
  const DataProto b1 = scored("g0", {{1, 1}, {0, 1}, {0, 0}});
  CHECK(s.add(b1, filter_metric_values(b1, "seq_reward")) == 1);
  CHECK_FALSE(s.full());
  CHECK_THROWS_AS(s.take(), Error);
  // batch 2: nothing kept
  const DataProto b2 = scored("g1", {{0, 0}, {1, 1}, {0, 0}});
  CHECK(s.add(b2, filter_metric_values(b2, "seq_reward")) == 0);
  // batch 3: three kept, one more than needed
  const DataProto b3 = scored("g2", {{1, 0}, {0, 0}, {0, 1}, {1, 0}});
  CHECK(s.add(b3, filter_metric_values(b3, "seq_reward")) == 3);
  REQUIRE(s.full());
  CHECK(s.num_gen_batches() == 3);
  CHECK(s.num_prompts() == 4);
  const DataProto batch = s.take();
  REQUIRE(batch.size() == 3 * 2);
  // the first kept groups in generation order, whole groups; the extra one (g2-3) is dropped
  CHECK(uids_of(batch) == std::vector<std::string>{"g0-1", "g0-1", "g2-0", "g2-0", "g2-2", "g2-2"});
  CHECK(batch.batch.at("token_level_scores").sum(-1).equal(torch::tensor({0.f, 1.f, 1.f, 0.f, 0.f, 1.f})));
  // take() starts the next step afresh
  CHECK(s.num_gen_batches() == 0);
  CHECK(s.num_prompts() == 0);
  CHECK_FALSE(s.full());
}

TEST_CASE("dynamic sampling with rollout.n = 1 keeps every prompt (groups of one sample)") {
  DynamicSampler s(2, 1, 0);
  const DataProto b = scored("g", {{0}, {0}, {1}});
  CHECK(s.add(b, filter_metric_values(b, "acc")) == 3);
  REQUIRE(s.full());
  CHECK(s.take().size() == 2);
}

TEST_CASE("dynamic sampling past max_num_gen_batches is a ValueError naming the key") {
  DynamicSampler s(2, 2, /*max_num_gen_batches=*/2);
  const DataProto flat = scored("g", {{0, 0}, {1, 1}});
  CHECK(s.add(flat, filter_metric_values(flat, "acc")) == 0);
  CHECK_THROWS_AS(s.add(flat, filter_metric_values(flat, "acc")), ValueError);
  DynamicSampler t(2, 2, 2);
  (void)t.add(flat, filter_metric_values(flat, "acc"));
  CHECK_THROWS_WITH(t.add(flat, filter_metric_values(flat, "acc")),
                    Catch::Contains("algorithm.filter_groups.max_num_gen_batches"));
  // a batch that fills up on the last allowed generation batch is fine
  DynamicSampler u(2, 2, 2);
  (void)u.add(flat, filter_metric_values(flat, "acc"));
  const DataProto good = scored("h", {{0, 1}, {1, 0}});
  CHECK(u.add(good, filter_metric_values(good, "acc")) == 2);
  CHECK(u.take().size() == 4);
  // 0: unlimited
  DynamicSampler v(2, 2, 0);
  for (int i = 0; i < 20; ++i) (void)v.add(flat, filter_metric_values(flat, "acc"));
  CHECK(v.num_gen_batches() == 20);
}
