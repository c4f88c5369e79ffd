// DecodeEngine::run with DecodeHooks: requests admitted at a later step decode exactly as in a
// run of their own (greedy and seeded sampling), tokens reach on_token as they are chosen, and a
// sample ended by on_token leaves the batch at once; a paused run resumes at its sampling step;
// top_logprobs alternatives.
#include "decode_test_util.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/inference/decode_engine.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <map>

using namespace hyflow;
using namespace hyflow::inference;
using namespace hyflow::testing;

namespace {

std::vector<DecodeRequest> requests() {
  return {DecodeRequest{.prompt = {5, 9, 3, 7}, .positions = {}, .n = 1, .max_new_tokens = 12, .first_row_id = 0},
          DecodeRequest{.prompt = {4, 4, 8}, .positions = {}, .n = 2, .max_new_tokens = 9, .first_row_id = 1},
          DecodeRequest{.prompt = {11, 3, 6, 2, 9, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22},
                        .positions = {},
                        .n = 1,
                        .max_new_tokens = 7,
                        .first_row_id = 3}};
}

}  // namespace

TEST_CASE("requests admitted one per step decode as in one batch, greedy and seeded") {
  auto model = make_model(tiny_model_config(), 11);
  DecodeEngine engine(model, {.max_batch = 8, .block_size = 4});
  for (bool greedy : {true, false}) {
    DecodeSampling sampling;
    sampling.sampling = cuda::SamplingOptions{.temperature = 0.9, .top_k = 20, .greedy = greedy};
    sampling.seed = 7;
    sampling.return_log_probs = true;
    const auto reference = engine.run(requests(), sampling);

    auto queue = requests();
    size_t next = 0;
    std::vector<std::vector<int64_t>> streamed(4);
    DecodeHooks hooks;
    hooks.reserve_positions = 64;
    hooks.admit = [&] {
      std::vector<DecodeRequest> out;
      if (next < queue.size()) out.push_back(queue[next++]);  // one new request per step, mid-run
      return out;
    };
    hooks.on_token = [&](int64_t output, int64_t token, float) {
      streamed[static_cast<size_t>(output)].push_back(token);
      return true;
    };
    const auto joined = engine.run({}, sampling, hooks);
    REQUIRE(joined.size() == reference.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      CHECK(joined[i].tokens == reference[i].tokens);
      CHECK(streamed[i] == reference[i].tokens);
      REQUIRE(joined[i].log_probs.size() == reference[i].log_probs.size());
      for (size_t t = 0; t < reference[i].log_probs.size(); ++t) {
        CHECK(joined[i].log_probs[t] == Approx(reference[i].log_probs[t]).margin(1e-5));
      }
    }
    CHECK(engine.stats().steps > 3);
  }
}

TEST_CASE("on_token returning false ends a sample at that token; the others run on") {
  auto model = make_model(tiny_model_config(), 3);
  DecodeEngine engine(model, {.max_batch = 8, .block_size = 4});
  DecodeSampling sampling;
  sampling.sampling.greedy = true;
  const auto reference = engine.run(requests(), sampling);
  DecodeHooks hooks;
  hooks.reserve_positions = 64;
  hooks.on_token = [&](int64_t output, int64_t, float) { return output != 1; };  // sample 0 of request 1
  const auto cut = engine.run(requests(), sampling, hooks);
  CHECK(cut[1].tokens == std::vector<int64_t>{reference[1].tokens.front()});
  CHECK(cut[0].tokens == reference[0].tokens);
  CHECK(cut[2].tokens == reference[2].tokens);
  CHECK(cut[3].tokens == reference[3].tokens);
}

TEST_CASE("hooks are checked: admit needs reserve_positions, a request past it is refused") {
  auto model = make_model(tiny_model_config(), 3);
  DecodeSampling sampling;
  sampling.sampling.greedy = true;
  DecodeEngine unbounded(model, {.max_batch = 0});
  DecodeHooks reserve_only;
  reserve_only.reserve_positions = 32;
  CHECK_THROWS_WITH(unbounded.run({}, sampling, reserve_only), Catch::Contains("max_batch > 0"));
  DecodeEngine engine(model, {.max_batch = 4, .block_size = 4});
  DecodeHooks admit_only;
  admit_only.admit = [] { return std::vector<DecodeRequest>{}; };
  CHECK_THROWS_WITH(engine.run({}, sampling, admit_only), Catch::Contains("reserve_positions > 0"));
  DecodeHooks small;
  small.reserve_positions = 10;
  CHECK_THROWS_WITH(engine.run(requests(), sampling, small), Catch::Contains("reserve_positions 10"));
}

TEST_CASE("pause ends a run with its tokens so far; resumed at first_step, seeded samples decode as uninterrupted") {
  auto model = make_model(tiny_model_config(), 11);
  DecodeEngine engine(model, {.max_batch = 8, .block_size = 4});
  DecodeSampling sampling;
  sampling.sampling = cuda::SamplingOptions{.temperature = 0.9, .top_k = 20};
  sampling.seed = 5;
  const auto reference = engine.run(requests(), sampling);

  DecodeHooks hooks;
  hooks.reserve_positions = 64;
  int64_t steps = 0;
  hooks.pause = [&] { return ++steps > 4; };  // four steps, then the run stops
  const auto paused = engine.run(requests(), sampling, hooks);
  REQUIRE(paused.size() == reference.size());
  // Every output is cut short and is a prefix of the uninterrupted one.
  const auto all = requests();
  std::vector<DecodeRequest> resumed;
  std::vector<int64_t> owner{0, 1, 1, 2};  // output -> request
  for (size_t i = 0; i < paused.size(); ++i) {
    const auto& got = paused[i].tokens;
    REQUIRE(!got.empty());
    REQUIRE(got.size() < reference[i].tokens.size());
    CHECK(std::equal(got.begin(), got.end(), reference[i].tokens.begin()));
    const auto& r = all[static_cast<size_t>(owner[i])];
    auto prompt = r.prompt;
    prompt.insert(prompt.end(), got.begin(), got.end());
    const int64_t sample = i == 2 ? 1 : 0;
    resumed.push_back(DecodeRequest{.prompt = prompt,
                                    .positions = {},
                                    .n = 1,
                                    .max_new_tokens = r.max_new_tokens - static_cast<int64_t>(got.size()),
                                    .first_row_id = r.first_row_id + sample,
                                    .first_step = static_cast<int64_t>(got.size())});
  }
  const auto rest = engine.run(resumed, sampling);
  for (size_t i = 0; i < paused.size(); ++i) {
    auto whole = paused[i].tokens;
    whole.insert(whole.end(), rest[i].tokens.begin(), rest[i].tokens.end());
    CHECK(whole == reference[i].tokens);
  }
  // Without first_step the resumed samples draw other tokens (the step counter restarts).
  for (auto& r : resumed) r.first_step = 0;
  const auto restarted = engine.run(resumed, sampling);
  bool differs = false;
  for (size_t i = 0; i < paused.size(); ++i) differs = differs || restarted[i].tokens != rest[i].tokens;
  CHECK(differs);
}

TEST_CASE("top_logprobs: the k most likely tokens per chosen one, from the chosen token's log softmax") {
  auto model = make_model(tiny_model_config(), 3);
  DecodeEngine engine(model, {.max_batch = 8, .block_size = 4});
  DecodeSampling sampling;
  sampling.sampling.greedy = true;
  sampling.return_log_probs = true;
  auto reqs = requests();
  reqs[1].top_logprobs = 5;  // only request 1 (outputs 1 and 2) asks
  std::map<int64_t, std::vector<std::vector<TokenLogProb>>> tops;
  std::map<int64_t, std::vector<std::pair<int64_t, float>>> chosen;
  DecodeHooks hooks;
  hooks.reserve_positions = 64;
  hooks.on_top_logprobs = [&](int64_t output, const std::vector<TokenLogProb>& top) { tops[output].push_back(top); };
  hooks.on_token = [&](int64_t output, int64_t token, float lp) {
    chosen[output].emplace_back(token, lp);
    return true;
  };
  engine.run(reqs, sampling, hooks);
  CHECK(tops.count(0) == 0);
  CHECK(tops.count(3) == 0);
  for (int64_t output : {1, 2}) {
    REQUIRE(tops[output].size() == chosen[output].size());
    for (size_t t = 0; t < tops[output].size(); ++t) {
      const auto& top = tops[output][t];
      REQUIRE(top.size() == 5);
      CHECK(top[0].token == chosen[output][t].first);  // greedy: the most likely one
      CHECK(top[0].log_prob == Approx(chosen[output][t].second).margin(1e-6));
      double mass = 0.0;
      for (size_t i = 0; i < top.size(); ++i) {
        CHECK(top[i].log_prob <= 0.0F);
        if (i > 0) CHECK(top[i].log_prob <= top[i - 1].log_prob);
        mass += std::exp(static_cast<double>(top[i].log_prob));
      }
      CHECK(mass <= 1.0 + 1e-5);
    }
  }
  reqs[1].top_logprobs = 2;
  DecodeEngine aten(model, {.max_batch = 8, .block_size = 4, .backend = DecodeBackend::kAten});
  CHECK_THROWS_WITH(aten.run(reqs, sampling), Catch::Contains("top_logprobs"));
  sampling.return_log_probs = false;
  CHECK_THROWS_WITH(engine.run(reqs, sampling), Catch::Contains("return_log_probs"));
}

TEST_CASE("requests with their own sampling settings share a run and each decodes as in a run of its own") {
  auto model = make_model(tiny_model_config(), 11);
  DecodeEngine engine(model, {.max_batch = 8, .block_size = 4});
  const std::vector<cuda::SamplingOptions> own{cuda::SamplingOptions{.greedy = true},
                                               cuda::SamplingOptions{.temperature = 0.9, .top_k = 20},
                                               cuda::SamplingOptions{.temperature = 0.7, .top_p = 0.9}};
  const std::vector<uint64_t> seeds{0, 7, 3};
  auto mixed = requests();
  std::vector<std::vector<int64_t>> alone;  // per output
  for (size_t r = 0; r < mixed.size(); ++r) {
    DecodeSampling sampling;
    sampling.sampling = own[r];
    sampling.seed = seeds[r];
    for (const auto& o : engine.run({requests()[r]}, sampling)) alone.push_back(o.tokens);
    mixed[r].sampling = own[r];
    mixed[r].seed = seeds[r];
  }
  DecodeSampling run_default;  // the run's own settings, which every request here overrides
  run_default.sampling = cuda::SamplingOptions{.temperature = 1.3};
  run_default.seed = 99;
  const auto together = engine.run(mixed, run_default);
  REQUIRE(together.size() == alone.size());
  for (size_t i = 0; i < alone.size(); ++i) CHECK(together[i].tokens == alone[i]);
  // Without the overrides the run's settings apply: other tokens.
  const auto defaulted = engine.run(requests(), run_default);
  bool differs = false;
  for (size_t i = 0; i < alone.size(); ++i) differs = differs || defaulted[i].tokens != alone[i];
  CHECK(differs);
}
