// The decode engine's ATen backend (the device path: CUDA, bf16 / fp16) run on CPU tensors,
// against the CPU kernel backend and the reference generate().
#include "decode_test_util.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/inference/decode_engine.hpp>
#include <hyflow/inference/generation.hpp>
#include <hyflow/models/response_scores.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using namespace hyflow::models;
using namespace hyflow::inference;
using namespace hyflow::testing;

namespace {

GenerationOptions on(GenerationOptions opts, DecodeBackend backend) {
  opts.engine = GenerationEngine::kDecode;
  opts.decode.backend = backend;
  return opts;
}

void check_same_rollout(const DataProto& a, const DataProto& b, double log_prob_tolerance) {
  for (const char* key : {"responses", "response_mask", "input_ids", "attention_mask", "position_ids"}) {
    INFO(key);
    CHECK(torch::equal(a.batch.at(key), b.batch.at(key)));
  }
  if (a.batch.contains("rollout_log_probs")) {
    CHECK(torch::allclose(a.batch.at("rollout_log_probs"), b.batch.at("rollout_log_probs"), log_prob_tolerance,
                          log_prob_tolerance));
  }
}

}  // namespace

TEST_CASE("kAuto runs float32 and bf16 CPU models on the kernels and other dtypes on ATen; kKernels refuses fp16") {
  auto model = make_model(llama_config(), 31);
  CHECK(DecodeEngine(model).backend() == DecodeBackend::kKernels);
  CHECK(DecodeEngine(model, {.backend = DecodeBackend::kAten}).backend() == DecodeBackend::kAten);
  model->to(torch::kBFloat16);
  CHECK(DecodeEngine::kernels_support(model));
  CHECK(DecodeEngine(model).backend() == DecodeBackend::kKernels);
  CHECK(DecodeEngine(model, {.backend = DecodeBackend::kAten}).backend() == DecodeBackend::kAten);
  model->to(torch::kHalf);
  CHECK(DecodeEngine::supports(model));
  CHECK_FALSE(DecodeEngine::kernels_support(model));
  CHECK(DecodeEngine(model).backend() == DecodeBackend::kAten);
  CHECK_THROWS_WITH(DecodeEngine(model, {.backend = DecodeBackend::kKernels}),
                    Catch::Contains("float32 or bf16 contiguous CPU parameters"));
  // one parameter of another dtype: neither backend
  model->to(torch::kFloat);
  {
    torch::NoGradGuard g;
    model->model->norm->weight.set_data(model->model->norm->weight.to(torch::kBFloat16));
  }
  CHECK_FALSE(DecodeEngine::kernels_support(model));
}

TEST_CASE("the ATen backend's greedy tokens equal the CPU kernels' and the reference's on Llama and Qwen2 shapes") {
  for (const auto& config : {llama_config(), qwen2_config()}) {
    INFO(config.architecture);
    auto model = make_model(config, 21);
    GenerationOptions opts{.max_new_tokens = 24, .n = 2, .do_sample = false, .return_log_probs = true};
    opts.decode.block_size = 4;  // many blocks, partial prompt blocks copied for the second sample
    auto reference = generate(model, prompt_batch(kPrompts), opts);
    CHECK(reference.batch["response_mask"].sum().item<int64_t>() >= 8 * 12);  // long responses, not an early EOS
    auto kernels = generate(model, prompt_batch(kPrompts), on(opts, DecodeBackend::kKernels));
    auto aten = generate(model, prompt_batch(kPrompts), on(opts, DecodeBackend::kAten));
    check_same_rollout(aten, reference, 1e-4);
    check_same_rollout(aten, kernels, 1e-4);
  }
}

TEST_CASE("the ATen backend's sampled tokens are reproducible and equal the CPU kernels' (the same sampler)") {
  auto model = make_model(llama_config(), 23);
  GenerationOptions opts{.max_new_tokens = 12,
                         .n = 4,
                         .sampling = {.temperature = 1.0, .top_p = 0.95},
                         .seed = 9,
                         .return_log_probs = true};
  auto aten = generate(model, prompt_batch(kPrompts), on(opts, DecodeBackend::kAten));
  check_same_rollout(aten, generate(model, prompt_batch(kPrompts), on(opts, DecodeBackend::kAten)), 0.0);
  check_same_rollout(aten, generate(model, prompt_batch(kPrompts), on(opts, DecodeBackend::kKernels)), 1e-4);
  CHECK_FALSE(torch::equal(aten.batch["responses"][0], aten.batch["responses"][1]));  // samples differ
  // a row's tokens do not depend on the slots, the block size or prefix sharing
  opts.decode = DecodeEngineOptions{.max_batch = 4, .block_size = 2, .share_prefix = false};
  check_same_rollout(aten, generate(model, prompt_batch(kPrompts), on(opts, DecodeBackend::kAten)), 1e-5);
  opts.seed = 10;
  CHECK_FALSE(torch::equal(aten.batch["responses"],
                           generate(model, prompt_batch(kPrompts), on(opts, DecodeBackend::kAten)).batch["responses"]));
}

TEST_CASE("the ATen backend's rollout log-probs equal the actor's recomputation") {
  auto model = make_model(qwen2_config(), 24);
  const double temperature = 0.8;
  auto out = generate(model, prompt_batch(kPrompts),
                      on(GenerationOptions{.max_new_tokens = 10,
                                           .n = 2,
                                           .sampling = {.temperature = temperature, .top_k = 20},
                                           .seed = 5,
                                           .return_log_probs = true},
                         DecodeBackend::kAten));
  torch::NoGradGuard g;
  auto scores = compute_response_scores(model, out, ScoreOptions{.temperature = temperature});
  auto mask = out.batch["response_mask"].to(torch::kBool);
  CHECK(torch::allclose(scores.log_probs.masked_fill(~mask, 0), out.batch["rollout_log_probs"], 1e-4, 1e-5));
}

TEST_CASE("prefix sharing and continuous batching schedule the same on both backends") {
  auto model = make_model(qwen2_config(), 25);
  std::vector<int64_t> prompt(37);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(3 + i % 30);
  const std::vector<DecodeRequest> requests{DecodeRequest{.prompt = prompt, .n = 8, .max_new_tokens = 6},
                                            DecodeRequest{.prompt = {4, 5, 6}, .n = 3, .max_new_tokens = 11},
                                            DecodeRequest{.prompt = {7}, .n = 1, .max_new_tokens = 2}};
  DecodeSampling sampling{.sampling = {.greedy = true}, .eos_token_ids = {2}, .return_log_probs = true};
  for (bool share : {true, false}) {
    INFO("share_prefix " << share);
    DecodeEngineOptions options{.max_batch = 9, .block_size = 8, .share_prefix = share, .max_prefill_tokens = 16};
    DecodeEngine kernels(model, options);
    options.backend = DecodeBackend::kAten;
    DecodeEngine aten(model, options);
    const auto a = aten.run(requests, sampling), k = kernels.run(requests, sampling);
    REQUIRE(a.size() == k.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].tokens == k[i].tokens);
      for (size_t t = 0; t < a[i].log_probs.size(); ++t)
        CHECK(a[i].log_probs[t] == Approx(k[i].log_probs[t]).margin(1e-4));
    }
    const auto& sa = aten.stats();
    const auto& sk = kernels.stats();
    CHECK(sa.steps == sk.steps);
    CHECK(sa.prefill_tokens == sk.prefill_tokens);
    CHECK(sa.decode_tokens == sk.decode_tokens);
    CHECK(sa.peak_kv_blocks == sk.peak_kv_blocks);
    CHECK(sa.kv_block_bytes == sk.kv_block_bytes);
    CHECK(sa.packed_weights == 0);
    CHECK(aten.packed_bytes() == 0);
  }
}

TEST_CASE("the ATen backend picks up weight updates between runs without repacking") {
  auto model = make_model(llama_config(), 26);
  DecodeEngine engine(model, {.backend = DecodeBackend::kAten});
  const std::vector<DecodeRequest> requests{DecodeRequest{.prompt = {5, 6, 7}, .n = 2, .max_new_tokens = 8}};
  DecodeSampling sampling{.sampling = {.greedy = true}, .return_log_probs = true};
  const auto before = engine.run(requests, sampling);
  {
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.mul_(1.5);
  }
  const auto after = engine.run(requests, sampling);
  const auto fresh = DecodeEngine(model, {.backend = DecodeBackend::kAten}).run(requests, sampling);
  CHECK(after[0].tokens == fresh[0].tokens);
  CHECK(after[0].log_probs == fresh[0].log_probs);
  CHECK(after[0].log_probs != before[0].log_probs);
}

TEST_CASE("bf16 models decode on the ATen backend, scored like the actor scores them") {
  auto model = make_model(qwen2_config(), 27);
  model->to(torch::kBFloat16);
  GenerationOptions opts{.max_new_tokens = 12, .n = 2, .do_sample = false, .return_log_probs = true};
  auto out = generate(model, prompt_batch(kPrompts), on(opts, DecodeBackend::kAten));
  CHECK(out.batch["response_mask"].sum().item<int64_t>() >= 8 * 4);
  check_same_rollout(out, generate(model, prompt_batch(kPrompts), on(opts, DecodeBackend::kAten)), 0.0);
  // The actor's bf16 recomputation of the same tokens: bf16 logits differ by the summation order
  // of the products (another batch shape), so the log-probs agree to bf16 precision.
  torch::NoGradGuard g;
  auto scores = compute_response_scores(model, out);
  auto mask = out.batch["response_mask"].to(torch::kBool);
  CHECK(torch::allclose(scores.log_probs.masked_fill(~mask, 0), out.batch["rollout_log_probs"], 0.05, 0.05));
  // and greedy picked an argmax of the recomputation, up to bf16 rounding of the logits
  const int64_t P = out.batch["prompts"].size(1), R = out.batch["responses"].size(1);
  auto logits = model(out.batch["input_ids"], out.batch["attention_mask"], out.batch["position_ids"])
                    .narrow(1, P - 1, R)
                    .to(torch::kFloat);  // (N, R, V): logits at t score token t + 1
  auto chosen = logits.gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1);
  auto gap = (std::get<0>(logits.max(-1)) - chosen).masked_fill(~mask, 0);  // 0 where greedy took the argmax
  CHECK(gap.max().item<double>() <= 0.1);
  CHECK(gap.eq(0).to(torch::kFloat).mean().item<double>() > 0.9);
}

TEST_CASE(
    "the ATen backend attends in chunks of blocks: the largest gather stays under the bound whatever the rows and "
    "context, greedy tokens equal the single gather's") {
  const auto config = qwen2_config();
  auto model = make_model(config, 51);
  const int64_t kv_row = config.num_key_value_heads * config.resolved_head_dim();  // elements per row and position
  std::vector<int64_t> prompt(8);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(3 + (7 * i) % 30);
  const DecodeSampling sampling{.sampling = {.greedy = true}, .return_log_probs = true};
  // 8 prefill rows over 8 positions, then 8 rows over up to 8 + new - 1 positions.
  const int64_t bound = 64 * kv_row;  // 8 rows x 2 blocks of 4
  int64_t previous_whole = 0;
  for (const int64_t new_tokens : {40, 80}) {
    INFO("max_new_tokens " << new_tokens);
    const std::vector<DecodeRequest> requests{DecodeRequest{.prompt = prompt, .n = 8, .max_new_tokens = new_tokens}};
    DecodeEngine whole(model, {.block_size = 4, .backend = DecodeBackend::kAten});
    DecodeEngine chunked(model, {.block_size = 4, .backend = DecodeBackend::kAten, .attention_chunk_elements = bound});
    const auto a = whole.run(requests, sampling);
    const auto b = chunked.run(requests, sampling);
    // the single gather grows with rows x context; the chunked one does not pass the bound
    CHECK(whole.stats().attention_gather_elements == 8 * (8 + new_tokens - 1) * kv_row);
    CHECK(whole.stats().attention_gather_elements > previous_whole);
    previous_whole = whole.stats().attention_gather_elements;
    CHECK(chunked.stats().attention_gather_elements <= bound);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].tokens == b[i].tokens);
      REQUIRE(a[i].log_probs.size() == b[i].log_probs.size());
      for (size_t t = 0; t < a[i].log_probs.size(); ++t) CHECK(std::abs(a[i].log_probs[t] - b[i].log_probs[t]) < 1e-5);
    }
  }
  CHECK_THROWS_AS(DecodeEngine(model, {.attention_chunk_elements = 0}), ValueError);
}
