#include "decode_test_util.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/inference/generation.hpp>
#include <hyflow/models/response_scores.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using namespace hyflow::models;
using namespace hyflow::inference;
using hyflow::testing::prompt_batch;
using hyflow::testing::tiny_model_config;

namespace {

// Greedy decoding by running the whole sequence through the model at every step.
std::vector<int64_t> greedy_by_recompute(CausalLM& model, std::vector<int64_t> seq, int64_t steps, int64_t eos) {
  torch::NoGradGuard g;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < steps; ++i) {
    auto logits = model(torch::tensor(seq, torch::kLong).unsqueeze(0));
    const int64_t next = logits[0][-1].argmax().item<int64_t>();
    out.push_back(next);
    seq.push_back(next);
    if (next == eos) break;
  }
  return out;
}

std::vector<int64_t> row_tokens(const at::Tensor& responses, const at::Tensor& mask, int64_t row) {
  std::vector<int64_t> out;
  for (int64_t t = 0; t < responses.size(1); ++t) {
    if (mask[row][t].item<int64_t>()) out.push_back(responses[row][t].item<int64_t>());
  }
  return out;
}

const std::vector<std::vector<int64_t>> kPrompts = {{5, 6, 7, 8, 9, 10}, {11, 12}, {13, 14, 15, 16}};

}  // namespace

TEST_CASE("KV-cached greedy generation equals greedy decoding by full recompute") {
  torch::manual_seed(11);
  CausalLM model(tiny_model_config());
  auto out = generate(model, prompt_batch(kPrompts), GenerationOptions{.max_new_tokens = 10, .do_sample = false});
  for (int64_t b = 0; b < 3; ++b) {
    auto expected = greedy_by_recompute(model, kPrompts[static_cast<size_t>(b)], 10, 2);
    CHECK(row_tokens(out.batch["responses"], out.batch["response_mask"], b) == expected);
  }
}

TEST_CASE("a prompt alone and inside a padded batch gives the same tokens and log-probs") {
  torch::manual_seed(12);
  CausalLM model(tiny_model_config());
  GenerationOptions opts{.max_new_tokens = 8, .do_sample = false, .return_log_probs = true};
  auto batch = generate(model, prompt_batch(kPrompts), opts);
  for (int64_t b = 0; b < 3; ++b) {
    auto alone = generate(model, prompt_batch({kPrompts[static_cast<size_t>(b)]}), opts);
    CHECK(torch::equal(alone.batch["responses"][0], batch.batch["responses"][b]));
    CHECK(torch::allclose(alone.batch["rollout_log_probs"][0], batch.batch["rollout_log_probs"][b], 1e-4, 1e-5));
  }
}

TEST_CASE("rollout batch has verl's keys, right-padded responses and masks up to and including EOS") {
  torch::manual_seed(13);
  CausalLM model(tiny_model_config());
  auto prompts = prompt_batch(kPrompts);
  auto probe =
      generate(model, prompts, GenerationOptions{.max_new_tokens = 6, .do_sample = false, .eos_token_ids = {36}});
  // Declare row 0's third greedy token the EOS: row 0 must then stop right after it.
  const int64_t eos = probe.batch["responses"][0][2].item<int64_t>();
  const int64_t pad = 1;
  auto out =
      generate(model, prompts,
               GenerationOptions{.max_new_tokens = 6, .do_sample = false, .eos_token_ids = {eos}, .pad_token_id = pad});
  const auto& b = out.batch;
  for (const char* key : {"prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"}) {
    CHECK(b.contains(key));
  }
  CHECK_FALSE(b.contains("rollout_log_probs"));
  CHECK(b["responses"].sizes() == torch::IntArrayRef({3, 6}));
  CHECK(b["input_ids"].sizes() == torch::IntArrayRef({3, 12}));
  CHECK(torch::equal(b["input_ids"], torch::cat({b["prompts"], b["responses"]}, 1)));
  CHECK(torch::equal(b["attention_mask"], torch::cat({prompts.batch["attention_mask"], b["response_mask"]}, 1)));
  // row 0: first EOS at index <= 2; mask 1 through it, pads after
  int64_t first_eos = -1;
  for (int64_t t = 0; t < 6 && first_eos < 0; ++t) {
    if (b["responses"][0][t].item<int64_t>() == eos) first_eos = t;
  }
  REQUIRE(first_eos >= 0);
  REQUIRE(first_eos <= 2);
  for (int64_t t = 0; t < 6; ++t) {
    CHECK(b["response_mask"][0][t].item<int64_t>() == (t <= first_eos ? 1 : 0));
    if (t > first_eos) CHECK(b["responses"][0][t].item<int64_t>() == pad);
  }
  // positions: prompt positions, then last prompt position + 1, 2, ...
  auto pos = b["position_ids"];
  CHECK(pos[1][5].item<int64_t>() == 1);  // prompt of length 2, left-padded to 6
  CHECK(pos[1][6].item<int64_t>() == 2);
  CHECK(pos[1][11].item<int64_t>() == 7);
  CHECK(pos[0][6].item<int64_t>() == 6);
}

TEST_CASE("sampling is deterministic for a seed and n samples are interleaved") {
  torch::manual_seed(14);
  CausalLM model(tiny_model_config());
  auto prompts = prompt_batch(kPrompts);
  prompts.non_tensor_batch["uid"] = dataproto::Column{"a", "b", "c"};
  GenerationOptions opts{.max_new_tokens = 8, .n = 3, .sampling = {.temperature = 1.0, .top_p = 0.9}, .seed = 7};
  auto first = generate(model, prompts, opts);
  auto second = generate(model, prompts, opts);
  CHECK(torch::equal(first.batch["responses"], second.batch["responses"]));
  CHECK(first.size() == 9);
  for (int64_t i = 0; i < 9; ++i) {
    CHECK(torch::equal(first.batch["prompts"][i], prompts.batch["input_ids"][i / 3]));
    CHECK(first.non_tensor_batch.at("uid")[static_cast<size_t>(i)] == std::string(1, static_cast<char>('a' + i / 3)));
  }
  opts.seed = 8;
  CHECK_FALSE(torch::equal(first.batch["responses"], generate(model, prompts, opts).batch["responses"]));
  // samples of one prompt differ from each other (37 tokens, 8 steps, temperature 1)
  CHECK_FALSE(torch::equal(first.batch["responses"][0], first.batch["responses"][1]));
}

TEST_CASE("temperature near 0 generates what greedy generates") {
  torch::manual_seed(15);
  CausalLM model(tiny_model_config());
  auto prompts = prompt_batch(kPrompts);
  auto greedy = generate(model, prompts, GenerationOptions{.max_new_tokens = 8, .do_sample = false});
  auto cold =
      generate(model, prompts, GenerationOptions{.max_new_tokens = 8, .sampling = {.temperature = 1e-5}, .seed = 3});
  CHECK(torch::equal(greedy.batch["responses"], cold.batch["responses"]));
}

TEST_CASE("rollout log-probs equal the actor's recomputation with verl's alignment") {
  torch::manual_seed(16);
  CausalLM model(tiny_model_config());
  const double temperature = 0.7;
  auto out = generate(model, prompt_batch(kPrompts),
                      GenerationOptions{.max_new_tokens = 7, .sampling = {.temperature = temperature},
                                        .seed = 5, .return_log_probs = true});
  torch::NoGradGuard g;
  auto scores = compute_response_scores(model, out, ScoreOptions{.temperature = temperature, .with_entropy = true});
  auto mask = out.batch["response_mask"].to(torch::kBool);
  CHECK(torch::allclose(scores.log_probs.masked_fill(~mask, 0), out.batch["rollout_log_probs"], 1e-4, 1e-5));
  CHECK(scores.entropy.sizes() == torch::IntArrayRef({3, 7}));
  CHECK((scores.entropy >= 0).all().item<bool>());
}

TEST_CASE("generate rejects prompts without a mask and bad lengths") {
  CausalLM model(tiny_model_config());
  DataProto no_mask(TensorDict{{"input_ids", torch::zeros({1, 3}, torch::kLong)}});
  CHECK_THROWS_WITH(generate(model, no_mask, {}), Catch::Contains("attention_mask"));
  CHECK_THROWS_WITH(generate(model, prompt_batch({{1, 2}}), GenerationOptions{.max_new_tokens = 0}),
                    Catch::Contains("max_new_tokens"));
}

TEST_CASE("generation with oneDNN linears matches plain nn::Linear") {
  torch::manual_seed(17);
  CausalLM model(tiny_model_config());
  GenerationOptions opts{.max_new_tokens = 8, .do_sample = false, .return_log_probs = true};
  set_onednn_linear(false);
  auto plain = generate(model, prompt_batch(kPrompts), opts);
  set_onednn_linear(true);
  auto fast = generate(model, prompt_batch(kPrompts), opts);
  CHECK(torch::equal(plain.batch["responses"], fast.batch["responses"]));
  CHECK(torch::allclose(plain.batch["rollout_log_probs"], fast.batch["rollout_log_probs"], 1e-4, 1e-5));
}

TEST_CASE("rollout tensors can feed a training forward (no inference-mode tensors leak)") {
  torch::manual_seed(18);
  CausalLM model(tiny_model_config());
  auto out = generate(model, prompt_batch(kPrompts), GenerationOptions{.max_new_tokens = 4, .do_sample = false});
  auto scores = compute_response_scores(model, out);
  scores.log_probs.sum().backward();
  CHECK(model->model->embed_tokens->weight.grad().defined());
}

TEST_CASE("a bf16 model generates with float32 rollout log-probs") {
  torch::manual_seed(19);
  CausalLM model(tiny_model_config());
  model->to(torch::kBFloat16);
  auto out =
      generate(model, prompt_batch(kPrompts),
               GenerationOptions{.max_new_tokens = 5, .sampling = {.top_k = 5}, .seed = 1, .return_log_probs = true});
  CHECK(out.batch["responses"].sizes() == torch::IntArrayRef({3, 5}));
  CHECK(out.batch["rollout_log_probs"].scalar_type() == torch::kFloat);
  CHECK(out.batch["rollout_log_probs"].isfinite().all().item<bool>());
  CHECK((out.batch["rollout_log_probs"] <= 0).all().item<bool>());
}

TEST_CASE("an inference context caches keys and values and packs each linear weight once") {
  for (bool tied : {true, false}) {
    INFO("tied embeddings: " << tied);
    torch::manual_seed(20);
    CausalLM model(tiny_model_config({.tie_word_embeddings = tied}));
    auto ids = torch::randint(3, 37, {2, 6});
    at::Tensor full;
    {
      torch::NoGradGuard no_grad;
      full = model(ids);  // (2, 6, V) in one pass, no context
    }
    c10::InferenceMode inference;
    InferenceContext context(model->config(), 2, 6, model->parameters().front().options());
    auto prefill = model->forward(ids.narrow(1, 0, 4), {}, {}, &context);  // (2, 4, V)
    CHECK(context.kv_cache().length() == 4);
    // 2 layers x (q, k, v, o, gate, up, down) + the LM head (the embedding when tied)
    const auto packed = context.packed_weight_count();
    CHECK(packed == (at::hasMKLDNN() ? 2u * 7u + 1u : 0u));
    auto step = model->forward(ids.narrow(1, 4, 2), {}, {}, &context);  // (2, 2, V) on the cached 4
    CHECK(context.kv_cache().length() == 6);
    CHECK(context.packed_weight_count() == packed);
    CHECK(torch::allclose(torch::cat({prefill, step}, 1), full, 1e-4, 1e-5));
    CHECK_THROWS_AS(model->forward(ids.narrow(1, 0, 1), {}, {}, &context), ShapeError);  // capacity 6 is full
  }
}

TEST_CASE(
    "generate with a kept DecodeEngine gives a fresh engine's rollout and repacks only the weights that changed") {
  torch::manual_seed(19);
  CausalLM model(tiny_model_config());
  DecodeEngine engine(model);
  for (const bool sampled : {false, true}) {
    CAPTURE(sampled);
    GenerationOptions options{.max_new_tokens = 6,
                              .n = 2,
                              .do_sample = sampled,
                              .seed = 5,
                              .return_log_probs = true,
                              .engine = GenerationEngine::kDecode};
    auto same_as_fresh = [&](const DataProto& kept) {
      const DataProto fresh = generate(model, prompt_batch(kPrompts), options);
      for (const auto& key : fresh.batch.keys()) {
        CAPTURE(key);
        CHECK(torch::equal(kept.batch.at(key), fresh.batch.at(key)));
      }
    };
    const DataProto first = generate(model, prompt_batch(kPrompts), options, engine);
    same_as_fresh(first);
    const DataProto again = generate(model, prompt_batch(kPrompts), options, engine);
    CHECK(engine.stats().packed_weights == 0);  // nothing changed, nothing repacked
    CHECK(torch::equal(again.batch.at("responses"), first.batch.at("responses")));

    {  // an update of one layer's weights (as an optimizer step: in place, version counter bumped)
      torch::NoGradGuard no_grad;
      for (auto& p : model->model->layers[0]->parameters()) p.mul_(-1.5);
    }
    const DataProto updated = generate(model, prompt_batch(kPrompts), options, engine);
    CHECK(engine.stats().packed_weights == 7);  // q, k, v, o, gate, up, down of that layer
    CHECK_FALSE(torch::equal(updated.batch.at("rollout_log_probs"), first.batch.at("rollout_log_probs")));
    same_as_fresh(updated);
  }
  // prompts the engine cannot take (the last column padding) run the reference path without it
  engine.drop_packed_weights();
  auto right_padded = prompt_batch({{5, 6}, {7}});
  right_padded.batch.set("attention_mask", torch::tensor({{1, 1}, {1, 0}}, torch::kLong));
  generate(model, right_padded,
           GenerationOptions{.max_new_tokens = 2, .do_sample = false, .engine = GenerationEngine::kDecode}, engine);
  CHECK(engine.packed_bytes() == 0);
}
