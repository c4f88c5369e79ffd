#include "../../models/src/decode/kernels.hpp"
#include "test_util.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/models/decode_engine.hpp>
#include <hyflow/models/generation.hpp>
#include <hyflow/models/response_scores.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using namespace hyflow::models;
using hyflow::models::testing::small_config;

namespace {

// A Llama shape with odd sizes: MHA, no bias, untied, head_dim 10, hidden sizes that are not
// multiples of the 8-float vector width (the kernels' scalar tails run).
ModelConfig llama_config() {
  return ModelConfig{
      .architecture = "LlamaForCausalLM",
      .vocab_size = 53,
      .hidden_size = 40,
      .intermediate_size = 76,
      .num_hidden_layers = 3,
      .num_attention_heads = 4,
      .num_key_value_heads = 4,
      .max_position_embeddings = 128,
      .tie_word_embeddings = false,
      .initializer_range = 0.2,
      .eos_token_ids = {2},
      .pad_token_id = 0,
  };
}

// A Qwen2 shape: GQA 4/2, QKV bias (set non-zero below), tied embeddings.
ModelConfig qwen2_config() {
  auto c = small_config();
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  return c;
}

CausalLM make_model(const ModelConfig& config, uint64_t seed) {
  torch::manual_seed(seed);
  CausalLM model(config);
  torch::NoGradGuard g;
  for (auto& item : model->named_parameters()) {
    if (item.key().ends_with(".bias")) item.value().normal_(0.0, 0.2);  // biases that matter
  }
  return model;
}

DataProto prompt_batch(const std::vector<std::vector<int64_t>>& rows) {
  int64_t P = 0;
  for (const auto& r : rows) P = std::max<int64_t>(P, static_cast<int64_t>(r.size()));
  const auto B = static_cast<int64_t>(rows.size());
  auto ids = torch::zeros({B, P}, torch::kLong);
  auto mask = torch::zeros({B, P}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const auto len = static_cast<int64_t>(rows[static_cast<size_t>(b)].size());
    ids[b].narrow(0, P - len, len).copy_(torch::tensor(rows[static_cast<size_t>(b)], torch::kLong));
    mask[b].narrow(0, P - len, len).fill_(1);
  }
  return DataProto(TensorDict{{"input_ids", ids}, {"attention_mask", mask}});
}

const std::vector<std::vector<int64_t>> kPrompts = {
    {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}, {11, 12}, {13, 14, 15, 16, 30}, {3}};

struct KernelMode {
  bool portable;
  explicit KernelMode(bool p) : portable(p) { decode::force_portable_kernels(p); }
  ~KernelMode() { decode::force_portable_kernels(false); }
};

}  // namespace

TEST_CASE("the decode GEMM equals x W^T + b on odd shapes, AVX2 and portable builds") {
  torch::manual_seed(1);
  for (bool portable : {false, true}) {
    KernelMode mode(portable);
    for (auto [rows, in, out] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 512, 33}, {3, 17, 9}, {8, 40, 76}, {50, 64, 5}, {2, 7, 1}}) {
      INFO("portable " << portable << " rows " << rows << " in " << in << " out " << out);
      auto x = torch::randn({rows, in});
      auto w = torch::randn({out, in});
      auto b = torch::randn({out});
      auto y = torch::randn({rows, out});
      auto expected = y + (torch::matmul(x, w.t()) + b);
      decode::linear(x.data_ptr<float>(), in, rows, w.data_ptr<float>(), b.data_ptr<float>(), in, out,
                     y.data_ptr<float>(), out, /*accumulate=*/true);
      CHECK(torch::allclose(y, expected, 1e-4, 1e-4));
      decode::linear(x.data_ptr<float>(), in, rows, w.data_ptr<float>(), nullptr, in, out, y.data_ptr<float>(), out,
                     false);
      CHECK(torch::allclose(y, torch::matmul(x, w.t()), 1e-4, 1e-4));
    }
  }
}

TEST_CASE("decode engine greedy tokens equal the reference generate on Llama and Qwen2 shapes") {
  for (const auto& config : {llama_config(), qwen2_config()}) {
    for (bool portable : {false, true}) {
      INFO(config.architecture << " portable kernels " << portable);
      KernelMode mode(portable);
      auto model = make_model(config, 21);
      GenerationOptions opts{.max_new_tokens = 24, .n = 2, .do_sample = false, .return_log_probs = true};
      auto reference = generate(model, prompt_batch(kPrompts), opts);
      CHECK(reference.batch["response_mask"].sum().item<int64_t>() >= 8 * 12);  // long responses, not an early EOS
      opts.engine = GenerationEngine::kDecode;
      opts.decode.block_size = 4;  // many blocks, partial prompt blocks copied for the second sample
      auto fast = generate(model, prompt_batch(kPrompts), opts);
      CHECK(torch::equal(fast.batch["responses"], reference.batch["responses"]));
      CHECK(torch::equal(fast.batch["response_mask"], reference.batch["response_mask"]));
      CHECK(torch::equal(fast.batch["input_ids"], reference.batch["input_ids"]));
      CHECK(torch::equal(fast.batch["position_ids"], reference.batch["position_ids"]));
      CHECK(torch::equal(fast.batch["attention_mask"], reference.batch["attention_mask"]));
      CHECK(torch::allclose(fast.batch["rollout_log_probs"], reference.batch["rollout_log_probs"], 1e-4, 1e-4));
    }
  }
}

TEST_CASE("continuous batching with few slots gives the tokens of one batch with all rows") {
  auto model = make_model(qwen2_config(), 22);
  GenerationOptions opts{.max_new_tokens = 20, .n = 3, .do_sample = false, .engine = GenerationEngine::kDecode};
  auto all = generate(model, prompt_batch(kPrompts), opts);
  opts.decode = DecodeEngineOptions{.max_batch = 4, .block_size = 3, .max_prefill_tokens = 1};
  auto few = generate(model, prompt_batch(kPrompts), opts);
  CHECK(torch::equal(all.batch["responses"], few.batch["responses"]));
  opts.decode = DecodeEngineOptions{.max_batch = 5, .share_prefix = false};
  CHECK(torch::equal(all.batch["responses"], generate(model, prompt_batch(kPrompts), opts).batch["responses"]));
}

TEST_CASE("decode engine sampling is reproducible for a seed and does not depend on the batch") {
  auto model = make_model(llama_config(), 23);
  auto prompts = prompt_batch(kPrompts);
  prompts.non_tensor_batch["uid"] = dataproto::Column{"a", "b", "c", "d"};
  GenerationOptions opts{.max_new_tokens = 12,
                         .n = 4,
                         .sampling = {.temperature = 1.0, .top_p = 0.95},
                         .seed = 9,
                         .return_log_probs = true,
                         .engine = GenerationEngine::kDecode};
  auto first = generate(model, prompts, opts);
  CHECK(torch::equal(first.batch["responses"], generate(model, prompts, opts).batch["responses"]));
  CHECK(first.non_tensor_batch.at("uid")[5] == std::string("b"));
  opts.decode = DecodeEngineOptions{.max_batch = 4, .block_size = 2, .share_prefix = false};
  auto small = generate(model, prompts, opts);
  CHECK(torch::equal(first.batch["responses"], small.batch["responses"]));
  CHECK(torch::allclose(first.batch["rollout_log_probs"], small.batch["rollout_log_probs"], 1e-5, 1e-6));
  CHECK_FALSE(torch::equal(first.batch["responses"][0], first.batch["responses"][1]));  // samples differ
  opts.seed = 10;
  CHECK_FALSE(torch::equal(first.batch["responses"], generate(model, prompts, opts).batch["responses"]));
}

TEST_CASE("decode engine rollout log-probs equal the actor's recomputation") {
  auto model = make_model(qwen2_config(), 24);
  const double temperature = 0.8;
  auto out = generate(model, prompt_batch(kPrompts),
                      GenerationOptions{.max_new_tokens = 10,
                                        .n = 2,
                                        .sampling = {.temperature = temperature, .top_k = 20},
                                        .seed = 5,
                                        .return_log_probs = true,
                                        .engine = GenerationEngine::kDecode});
  torch::NoGradGuard g;
  auto scores = compute_response_scores(model, out, ScoreOptions{.temperature = temperature});
  auto mask = out.batch["response_mask"].to(torch::kBool);
  CHECK(torch::allclose(scores.log_probs.masked_fill(~mask, 0), out.batch["rollout_log_probs"], 1e-4, 1e-5));
  // and the batch trains: no inference-mode tensor leaks out
  auto grad_scores = compute_response_scores(model, out);
  (void)grad_scores;
}

TEST_CASE("the n samples of a prompt share its prefill and its full KV blocks") {
  auto model = make_model(qwen2_config(), 25);
  std::vector<int64_t> prompt(37);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(3 + i % 30);
  DecodeSampling sampling{.sampling = {.greedy = true}};
  auto run = [&](int64_t n, bool share) {
    DecodeEngine engine(model, DecodeEngineOptions{.block_size = 8, .share_prefix = share});
    auto out = engine.run({DecodeRequest{.prompt = prompt, .n = n, .max_new_tokens = 6}}, sampling);
    CHECK(static_cast<int64_t>(out.size()) == n);
    for (const auto& o : out) CHECK(o.tokens == out[0].tokens);  // greedy samples agree
    return engine.stats();
  };
  const auto one = run(1, true), shared = run(8, true), copied = run(8, false);
  CHECK(shared.prefill_tokens == one.prefill_tokens);
  CHECK(copied.prefill_tokens == 8 * one.prefill_tokens);
  // 37 + 5 cached positions in blocks of 8: 6 blocks alone; shared: 4 full prompt blocks once,
  // then per sample its copy of the partial block and one more for the response.
  CHECK(one.peak_kv_blocks == 6);
  CHECK(shared.peak_kv_blocks == 4 + 8 * 2);
  CHECK(copied.peak_kv_blocks == 8 * 6);
}

TEST_CASE("a decode engine reused after an in-place weight update decodes with the new weights") {
  auto model = make_model(llama_config(), 26);
  DecodeEngine engine(model);
  DecodeSampling sampling{.sampling = {.greedy = true}, .eos_token_ids = {2}};
  const std::vector<DecodeRequest> requests{DecodeRequest{.prompt = {4, 5, 6}, .max_new_tokens = 12}};
  auto before = engine.run(requests, sampling);
  {
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.1);
  }
  auto after = engine.run(requests, sampling);
  auto reference = generate(model, prompt_batch({{4, 5, 6}}),
                            GenerationOptions{.max_new_tokens = 12, .do_sample = false, .eos_token_ids = {2}});
  std::vector<int64_t> expected;
  for (int64_t t = 0; t < 12; ++t) {
    if (reference.batch["response_mask"][0][t].item<int64_t>() == 0) break;
    expected.push_back(reference.batch["responses"][0][t].item<int64_t>());
  }
  CHECK(after[0].tokens == expected);
  CHECK(after[0].tokens != before[0].tokens);
}

TEST_CASE("decode engine rejects bad requests and generate falls back for models it cannot run") {
  auto model = make_model(llama_config(), 27);
  DecodeEngine engine(model);
  DecodeSampling greedy{.sampling = {.greedy = true}};
  CHECK_THROWS_AS(engine.run({DecodeRequest{}}, greedy), ValueError);
  CHECK_THROWS_WITH(engine.run({DecodeRequest{.prompt = {1, 99}}}, greedy), Catch::Contains("token id 99"));
  CHECK_THROWS_WITH(engine.run({DecodeRequest{.prompt = {1}, .positions = {0, 1}}}, greedy),
                    Catch::Contains("2 positions for 1 prompt tokens"));
  CHECK_THROWS_WITH(engine.run({DecodeRequest{.prompt = {1}, .n = 0}}, greedy), Catch::Contains("n must be > 0"));
  CHECK_THROWS_AS(DecodeEngine(model, DecodeEngineOptions{.block_size = 0}), ValueError);

  model->to(torch::kBFloat16);
  CHECK_FALSE(DecodeEngine::supports(model));
  CHECK_THROWS_AS(DecodeEngine(model), ValueError);
  GenerationOptions opts{.max_new_tokens = 4, .do_sample = false};
  auto reference = generate(model, prompt_batch(kPrompts), opts);
  opts.engine = GenerationEngine::kDecode;
  CHECK(torch::equal(reference.batch["responses"], generate(model, prompt_batch(kPrompts), opts).batch["responses"]));
}
