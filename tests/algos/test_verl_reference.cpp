// verl functions that hyflow lacked or computed differently, against the outputs that
// tests/algos/data/make_core_reference.py produced with torch and numpy: the legacy
// compute_policy_loss, compute_policy_loss_reinforce, logprobs_from_logits_naive, the
// training metrics (data, timing, throughput, reduce_metrics) and micro-batch rearrangement.
#include <hyflow/algos/core_algos.hpp>
#include <hyflow/algos/metric_utils.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/parallel/seqlen_balancing.hpp>

#include "reference_data.hpp"
#include "test_helpers.hpp"

#include <cmath>

namespace ca = hyflow::algos::core_algos;
namespace mu = hyflow::algos::metric_utils;
namespace sb = hyflow::parallel::seqlen_balancing;
using Json = nlohmann::json;

namespace {

const Json& reference() {
  static const Json ref = hyflow::test::load_reference("core_reference.json");
  return ref;
}

// A JSON nested list as a tensor of `dtype` (values are exact in that dtype).
at::Tensor tensor(const Json& j, at::ScalarType dtype) {
  std::vector<int64_t> shape;
  for (const Json* p = &j; p->is_array(); p = &(*p)[0]) shape.push_back(static_cast<int64_t>(p->size()));
  std::vector<double> flat;
  std::function<void(const Json&)> walk = [&](const Json& v) {
    if (v.is_array())
      for (const auto& e : v) walk(e);
    else
      flat.push_back(v.get<double>());
  };
  walk(j);
  return torch::tensor(flat, torch::kDouble).reshape(shape).to(dtype);
}

std::optional<double> opt(const Json& j) {
  return j.is_null() ? std::nullopt : std::optional<double>(j.get<double>());
}

// Every key of `expected` is in `actual` with the same value: integers exactly, floats to the
// last bit (both sides ran the same float32 torch ops, then .item()).
void require_same_metrics(const Json& actual, const Json& expected) {
  for (const auto& [k, v] : expected.items()) {
    CAPTURE(k);
    REQUIRE(actual.contains(k));
    if (v.is_number_integer())
      CHECK(actual.at(k) == v);
    else
      CHECK(actual.at(k).get<double>() == v.get<double>());
  }
}

}  // namespace

TEST_CASE("legacy compute_policy_loss returns verl's 4 tensors for each clip setting and aggregation") {
  const auto& in = reference().at("policy_loss_inputs");
  const auto old = tensor(in.at("old_log_prob"), at::kFloat), lp = tensor(in.at("log_prob"), at::kFloat);
  const auto adv = tensor(in.at("advantages"), at::kFloat), mask = tensor(in.at("response_mask"), at::kFloat);
  int cases = 0;
  for (const auto& c : reference().at("policy_losses")) {
    if (c.at("fn") != "compute_policy_loss") continue;
    ++cases;
    CAPTURE(c.dump());
    const auto out = ca::compute_policy_loss(old, lp, adv, mask, opt(c.at("cliprange")), opt(c.at("cliprange_low")),
                                             opt(c.at("cliprange_high")), c.at("clip_ratio_c").get<double>(),
                                             c.at("loss_agg_mode").get<std::string>());
    CHECK(out.pg_loss.item<double>() == c.at("pg_loss").get<double>());
    CHECK(out.pg_clipfrac.item<double>() == c.at("pg_clipfrac").get<double>());
    CHECK(out.ppo_kl.item<double>() == c.at("ppo_kl").get<double>());
    CHECK(out.pg_clipfrac_lower.item<double>() == c.at("pg_clipfrac_lower").get<double>());
  }
  CHECK(cases == 5);
  CHECK_THROWS_AS(ca::compute_policy_loss(old, lp, adv, mask), hyflow::ValueError);  // no clip range at all
  CHECK_THROWS_AS(ca::compute_policy_loss(old, lp, adv, mask, 0.2, {}, {}, 1.0), hyflow::ValueError);
}

TEST_CASE("compute_policy_loss_reinforce: -A·log_prob (·IS weight), aggregated with the global batch info") {
  const auto& in = reference().at("policy_loss_inputs");
  const auto old = tensor(in.at("old_log_prob"), at::kFloat);
  auto lp = tensor(in.at("log_prob"), at::kFloat).requires_grad_(true);
  const auto adv = tensor(in.at("advantages"), at::kFloat), mask = tensor(in.at("response_mask"), at::kFloat);
  const auto weights = tensor(in.at("rollout_is_weights"), at::kFloat);
  int cases = 0;
  for (const auto& c : reference().at("policy_losses")) {
    if (c.at("fn") != "compute_policy_loss_reinforce") continue;
    ++cases;
    CAPTURE(c.dump());
    ca::ActorConfig config;
    const auto& info = c.at("global_batch_info");
    if (info.contains("dp_size")) config.global_batch_info.dp_size = info.at("dp_size").get<int64_t>();
    if (info.contains("batch_num_tokens"))
      config.global_batch_info.batch_num_tokens = info.at("batch_num_tokens").get<double>();
    if (info.contains("global_batch_size"))
      config.global_batch_info.global_batch_size = info.at("global_batch_size").get<double>();
    if (info.contains("loss_scale_factor")) config.loss_scale_factor = info.at("loss_scale_factor").get<double>();
    const auto out =
        ca::compute_policy_loss_reinforce(old, lp, adv, mask, c.at("loss_agg_mode").get<std::string>(), config,
                                          c.at("use_weights").get<bool>() ? std::optional(weights) : std::nullopt);
    CHECK(out.pg_loss.item<double>() == c.at("pg_loss").get<double>());
    CHECK(out.pg_metrics.at("actor/ppo_kl") == c.at("ppo_kl").get<double>());
    CHECK(out.pg_metrics.size() == 1);
  }
  CHECK(cases == 6);
  // the gradient is the policy gradient: d/dlogp of -A·logp summed over tokens = -A·mask
  ca::ActorConfig sum_cfg;
  auto loss = ca::compute_policy_loss_reinforce(old, lp, adv, mask, "seq-mean-token-sum-norm", sum_cfg).pg_loss;
  loss.backward();
  hyflow::test::require_close(lp.grad(), -adv * mask / mask.size(-1), 1e-7);
}

TEST_CASE("logprobs_from_logits_naive equals log_softmax + gather in float32, float64 and bfloat16") {
  for (const auto& c : reference().at("logprobs_from_logits_naive")) {
    const auto name = c.at("dtype").get<std::string>();
    CAPTURE(name);
    const auto dtype = name == "float32" ? at::kFloat : name == "float64" ? at::kDouble : at::kBFloat16;
    const auto out = ca::logprobs_from_logits_naive(tensor(c.at("logits"), dtype), tensor(c.at("labels"), at::kLong));
    CHECK(out.scalar_type() == dtype);
    hyflow::test::require_close(out, tensor(c.at("expected"), at::kDouble), 0);
  }
  CHECK_THROWS_AS(ca::logprobs_from_logits_naive(torch::zeros({2, 3}), torch::zeros({3}, torch::kLong)),
                  hyflow::ShapeError);
}

namespace {
hyflow::DataProto metrics_batch(const Json& m) {
  const auto& b = m.at("batch");
  hyflow::dataproto::TensorDict td;
  for (const char* k : {"responses", "attention_mask", "response_mask"}) td.set(k, tensor(b.at(k), at::kLong));
  for (const char* k : {"token_level_scores", "token_level_rewards", "advantages", "returns", "values"})
    td.set(k, tensor(b.at(k), at::kFloat));
  hyflow::dataproto::NonTensorBatch nt;
  nt["__num_turns__"] = m.at("num_turns").get<hyflow::dataproto::Column>();
  nt["tool_call_counts"] = m.at("tool_call_counts").get<hyflow::dataproto::Column>();
  return hyflow::DataProto(std::move(td), std::move(nt), Json{{"global_token_num", m.at("global_token_num")}});
}
}  // namespace

TEST_CASE("compute_data_metrics leaves aborted rows out of score/reward and reports them as verl does") {
  const auto& m = reference().at("metrics");
  const auto batch = metrics_batch(m);
  const auto with_critic = mu::compute_data_metrics(batch, true);
  require_same_metrics(with_critic, m.at("data_metrics"));
  CHECK(with_critic.size() == m.at("data_metrics").size());
  // the aborted row's score of 5 would otherwise be the max
  CHECK(with_critic.at("critic/score/max").get<double>() < 5.0);

  auto no_critic_batch = batch;
  no_critic_batch.non_tensor_batch = {};
  const auto no_critic = mu::compute_data_metrics(no_critic_batch, false);
  require_same_metrics(no_critic, m.at("data_metrics_no_critic"));
  CHECK(no_critic.size() == m.at("data_metrics_no_critic").size());
  CHECK_FALSE(no_critic.contains("critic/values/mean"));
  CHECK_FALSE(no_critic.contains("num_turns/mean"));
}

TEST_CASE("compute_data_metrics refuses a batch whose responses are all empty, and a critic without values") {
  const auto& m = reference().at("metrics");
  auto batch = metrics_batch(m);
  const int64_t T = batch.batch.at("responses").size(1);
  auto attn = batch.batch.at("attention_mask").clone();
  attn.narrow(1, attn.size(1) - T, T).zero_();
  batch.batch.set("attention_mask", attn);
  CHECK_THROWS_WITH(mu::compute_data_metrics(batch, true), Catch::Contains("aborted"));
  auto no_values = metrics_batch(m);
  no_values.batch.pop("values");
  CHECK_THROWS_AS(mu::compute_data_metrics(no_values, true), hyflow::KeyError);
}

TEST_CASE("compute_timing_metrics and compute_throughout_metrics equal verl's") {
  const auto& m = reference().at("metrics");
  const auto batch = metrics_batch(m);
  const auto timing_raw = m.at("timing_raw").get<std::map<std::string, double>>();
  const auto timing = mu::compute_timing_metrics(batch, timing_raw);
  require_same_metrics(timing, m.at("timing_metrics"));
  CHECK(timing.size() == m.at("timing_metrics").size());
  const auto perf = mu::compute_throughout_metrics(batch, timing_raw, m.at("n_gpus").get<int64_t>());
  require_same_metrics(perf, m.at("throughout_metrics"));
  CHECK(perf.size() == 3);
  CHECK_THROWS_AS(mu::compute_throughout_metrics(batch, {{"gen", 1.0}}, 1), hyflow::KeyError);
}

TEST_CASE("reduce_metrics: max/min by substring ('admin' is min), numpy's pairwise mean, NaN for no values") {
  const auto& r = reference().at("reduce_metrics");
  const auto reduced = mu::reduce_metrics(r.at("metrics"));
  CHECK(reduced.size() == r.at("reduced").size());
  for (const auto& [k, v] : r.at("reduced").items()) {
    CAPTURE(k);
    if (v.is_null())
      CHECK(std::isnan(reduced.at(k)));
    else
      CHECK(reduced.at(k) == v.get<double>());  // bit for bit, also the 300-value mean
  }
  CHECK_THROWS_AS(mu::reduce_metrics(Json{{"a/max", Json::array()}}), hyflow::ValueError);
  CHECK_THROWS_WITH(mu::reduce_metrics(Json{{"loss", {1.0, "x"}}}), Catch::Contains("loss"));
  CHECK_THROWS_AS(mu::reduce_metrics(Json::array()), hyflow::ValueError);
}

TEST_CASE("rearrange_micro_batches equals verl's partitions, balanced or in KK order") {
  const auto& cases = reference().at("seqlen").at("rearrange");
  REQUIRE(cases.size() >= 20);
  for (const auto& c : cases) {
    CAPTURE(c.dump());
    sb::RearrangeOptions o;
    if (!c.at("divided_by").is_null()) o.num_batches_divided_by = c.at("divided_by").get<int64_t>();
    if (!c.at("min_num").is_null()) o.min_num_micro_batch = c.at("min_num").get<int64_t>();
    o.use_dynamic_bsz_balance = c.at("balance").get<bool>();
    o.force_group_size = c.at("group").get<int64_t>();
    if (!c.at("sync").is_null()) {
      const auto other_rank = c.at("sync").get<int64_t>();
      o.sync_num_micro_batches = [other_rank](int64_t n) { return std::max(n, other_rank); };
    }
    const auto parts =
        sb::rearrange_micro_batches(c.at("seqlens").get<std::vector<int64_t>>(), c.at("max_token_len").get<int64_t>(),
                                    c.at("padded_seq_len").get<int64_t>(), o);
    CHECK(parts == c.at("partitions").get<std::vector<std::vector<int64_t>>>());
  }
}

TEST_CASE("roundup_divisible is Python's ((a + b - 1) // b) * b") {
  for (const auto& c : reference().at("seqlen").at("roundup_divisible")) {
    CAPTURE(c.dump());
    CHECK(sb::roundup_divisible(c[0].get<int64_t>(), c[1].get<int64_t>()) == c[2].get<int64_t>());
  }
  CHECK_THROWS_AS(sb::roundup_divisible(3, 0), hyflow::ValueError);
}
