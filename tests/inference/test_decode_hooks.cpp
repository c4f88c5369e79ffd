// DecodeEngine::run with DecodeHooks: requests admitted at a later step decode exactly as in a
// run of their own (greedy and seeded sampling), tokens reach on_token as they are chosen, and a
// sample ended by on_token leaves the batch at once.
#include "decode_test_util.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/inference/decode_engine.hpp>

#include <catch2/catch.hpp>

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
