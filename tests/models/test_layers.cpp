#include "common/tiny_model.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/position_ids.hpp>
#include <hyflow/models/llama.hpp>

#include <catch2/catch.hpp>

#include <cmath>

using namespace hyflow::models;
using hyflow::position_ids_from_mask;
using hyflow::testing::tiny_model_config;

TEST_CASE("RMSNorm equals x / sqrt(mean(x^2) + eps) * weight") {
  torch::manual_seed(1);
  RMSNorm norm(8, 1e-5);
  {
    torch::NoGradGuard g;
    norm->weight.uniform_(0.5, 1.5);
  }
  auto x = torch::randn({3, 4, 8});
  auto xd = x.to(torch::kDouble);
  auto expected = xd / (xd.pow(2).mean(-1, true) + 1e-5).sqrt() * norm->weight.to(torch::kDouble);
  CHECK(torch::allclose(norm(x).to(torch::kDouble), expected, 1e-5, 1e-6));
}

TEST_CASE("rotary embedding rotates each (i, i + D/2) pair by pos * theta^(-2i/D)") {
  const int64_t D = 8;
  const double theta = 500.0;
  auto x = torch::randn({2, 3, 5, D}, torch::kDouble).to(torch::kFloat);  // (B, H, T, D)
  auto positions = torch::tensor({{0, 1, 2, 3, 4}, {7, 8, 9, 10, 40}});
  for (double factor : {1.0, 4.0}) {
    RotaryEmbedding rope(D, theta, RopeScaling{.type = factor == 1.0 ? "none" : "linear", .factor = factor});
    auto [cos, sin] = rope.cos_sin(positions, torch::kFloat);
    auto got = apply_rotary(x, cos, sin);
    auto expected = torch::empty_like(x);
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t t = 0; t < 5; ++t) {
        const double pos = positions[b][t].item<double>() / factor;
        for (int64_t i = 0; i < D / 2; ++i) {
          const double angle = pos * std::pow(theta, -2.0 * i / D);
          auto a = x.index({b, torch::indexing::Slice(), t, i});
          auto c = x.index({b, torch::indexing::Slice(), t, i + D / 2});
          expected.index_put_({b, torch::indexing::Slice(), t, i}, a * std::cos(angle) - c * std::sin(angle));
          expected.index_put_({b, torch::indexing::Slice(), t, i + D / 2}, c * std::cos(angle) + a * std::sin(angle));
        }
      }
    }
    CHECK(torch::allclose(got, expected, 1e-4, 1e-5));
  }
}

TEST_CASE("grouped-query attention matches a per-head loop with causal and padding masks") {
  torch::manual_seed(2);
  auto config = tiny_model_config();
  Attention attn(config);
  const int64_t B = 2, T = 5, H = 4, G = 2, D = 8;
  auto x = torch::randn({B, T, config.hidden_size});
  auto mask = torch::tensor({{1, 1, 1, 1, 1}, {0, 0, 1, 1, 1}}).to(torch::kBool);
  auto positions = position_ids_from_mask(mask);
  RotaryEmbedding rope(D, config.rope_theta, {});
  auto [cos, sin] = rope.cos_sin(positions, torch::kFloat);
  auto future = torch::ones({T, T}, torch::kBool).triu(1).view({1, 1, T, T});
  auto blocked = future.logical_or(mask.logical_not().view({B, 1, 1, T}));
  auto got = attn(x, cos, sin, blocked, nullptr, 0);

  torch::NoGradGuard g;
  auto q = apply_rotary(attn->q_proj(x).view({B, T, H, D}).transpose(1, 2), cos, sin);
  auto k = apply_rotary(attn->k_proj(x).view({B, T, H / G, D}).transpose(1, 2), cos, sin);
  auto v = attn->v_proj(x).view({B, T, H / G, D}).transpose(1, 2);
  auto heads = torch::zeros({B, T, H, D});
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> w;
        std::vector<int64_t> keys;
        for (int64_t s = 0; s <= t; ++s) {
          if (!mask[b][s].item<bool>()) continue;
          keys.push_back(s);
          w.push_back((q[b][h][t] * k[b][h / G][s]).sum().item<double>() / std::sqrt(double(D)));
        }
        if (keys.empty()) continue;  // a padding query: its output is never used
        double mx = *std::max_element(w.begin(), w.end()), z = 0;
        for (auto& wi : w) z += (wi = std::exp(wi - mx));
        for (size_t i = 0; i < keys.size(); ++i) heads[b][t][h] += v[b][h / G][keys[i]] * (w[i] / z);
      }
    }
  }
  auto expected = attn->o_proj(heads.reshape({B, T, H * D}));
  // compare the real (non-padding) query positions
  CHECK(torch::allclose(got[0], expected[0], 1e-4, 1e-5));
  CHECK(torch::allclose(got[1].narrow(0, 2, 3), expected[1].narrow(0, 2, 3), 1e-4, 1e-5));
}

TEST_CASE("parameter names are Hugging Face's") {
  CausalLM tied(tiny_model_config());
  CausalLM untied(tiny_model_config({.tie_word_embeddings = false}));
  auto names = [](torch::nn::Module& m) {
    std::vector<std::string> out;
    for (const auto& p : m.named_parameters()) out.push_back(p.key());
    return out;
  };
  auto n = names(*tied);
  CHECK(std::find(n.begin(), n.end(), "model.embed_tokens.weight") != n.end());
  CHECK(std::find(n.begin(), n.end(), "model.layers.1.self_attn.q_proj.bias") != n.end());
  CHECK(std::find(n.begin(), n.end(), "model.layers.0.mlp.gate_proj.weight") != n.end());
  CHECK(std::find(n.begin(), n.end(), "model.layers.0.post_attention_layernorm.weight") != n.end());
  CHECK(std::find(n.begin(), n.end(), "model.norm.weight") != n.end());
  CHECK(std::find(n.begin(), n.end(), "lm_head.weight") == n.end());
  auto u = names(*untied);
  CHECK(std::find(u.begin(), u.end(), "lm_head.weight") != u.end());
  int64_t count = 0;
  for (const auto& p : untied->parameters()) count += p.numel();
  CHECK(count == tiny_model_config({.tie_word_embeddings = false}).num_parameters());
}

TEST_CASE("tied embeddings: the LM head is the embedding matrix") {
  torch::manual_seed(3);
  CausalLM model(tiny_model_config());
  auto ids = torch::tensor({{3, 4, 5}});
  auto hidden = model->model(ids);
  CHECK(torch::allclose(model(ids), torch::matmul(hidden, model->model->embed_tokens->weight.t()), 1e-5, 1e-6));
}

TEST_CASE("gradient checkpointing gives the same loss and gradients") {
  torch::manual_seed(4);
  CausalLM model(tiny_model_config({.tie_word_embeddings = false}));
  auto ids = torch::randint(37, {2, 9});
  auto mask = torch::ones({2, 9}, torch::kLong);
  mask[1].narrow(0, 0, 3).zero_();
  auto run = [&](bool checkpoint) {
    model->zero_grad();
    model->model->set_gradient_checkpointing(checkpoint);
    auto logits = model(ids, mask);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 37}), ids.reshape({-1}));
    loss.backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return std::make_pair(loss.item<double>(), grads);
  };
  auto [loss_plain, grads_plain] = run(false);
  auto [loss_ckpt, grads_ckpt] = run(true);
  CHECK(loss_plain == Approx(loss_ckpt).epsilon(1e-6));
  REQUIRE(grads_plain.size() == grads_ckpt.size());
  for (size_t i = 0; i < grads_plain.size(); ++i) {
    CHECK(torch::allclose(grads_plain[i], grads_ckpt[i], 1e-4, 1e-6));
  }
}

TEST_CASE("bf16 forward stays close to float32") {
  torch::manual_seed(5);
  auto config = tiny_model_config();
  config.initializer_range = 0.05;
  CausalLM model(config);
  auto ids = torch::randint(37, {2, 6});
  auto ref = model(ids);
  model->to(torch::kBFloat16);
  auto low = model(ids);
  CHECK(low.scalar_type() == torch::kBFloat16);
  CHECK((low.to(torch::kFloat) - ref).abs().max().item<float>() < 0.05f * ref.abs().max().item<float>() + 0.02f);
}

TEST_CASE("value model gives one float32 value per token") {
  torch::manual_seed(6);
  ValueModel critic(tiny_model_config());
  auto values = critic(torch::randint(37, {3, 7}));
  CHECK(values.sizes() == torch::IntArrayRef({3, 7}));
  CHECK(values.scalar_type() == torch::kFloat);
}

TEST_CASE("a mask of the wrong width is rejected with the expected shape") {
  CausalLM model(tiny_model_config());
  CHECK_THROWS_WITH(model(torch::zeros({2, 4}, torch::kLong), torch::ones({2, 5}, torch::kLong)),
                    Catch::Contains("(2, 4)"));
}

TEST_CASE("config validation names the offending field") {
  auto c = tiny_model_config();
  c.num_key_value_heads = 3;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("num_key_value_heads"));
}

TEST_CASE("oneDNN linears give the logits and gradients of plain nn::Linear") {
  torch::manual_seed(7);
  CausalLM model(tiny_model_config({.tie_word_embeddings = false}));
  auto ids = torch::randint(37, {2, 6});
  auto run = [&](bool onednn) {
    set_onednn_linear(onednn);
    model->zero_grad();
    auto logits = model(ids);
    (logits * logits).mean().backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    set_onednn_linear(true);
    return std::make_pair(logits.detach(), grads);
  };
  auto [fast_logits, fast_grads] = run(true);
  auto [plain_logits, plain_grads] = run(false);
  CHECK(torch::allclose(fast_logits, plain_logits, 1e-4, 1e-5));
  for (size_t i = 0; i < fast_grads.size(); ++i) CHECK(torch::allclose(fast_grads[i], plain_grads[i], 1e-4, 1e-6));
}

TEST_CASE("left or right padding leaves the logits of real tokens unchanged") {
  torch::manual_seed(8);
  CausalLM model(tiny_model_config());
  torch::NoGradGuard g;
  auto real = torch::tensor({{4, 9, 16, 25}});
  auto alone = model(real);  // (1, 4, V)
  SECTION("right padding") {
    auto ids = torch::tensor({{4, 9, 16, 25, 0, 0}});
    auto mask = torch::tensor({{1, 1, 1, 1, 0, 0}});
    auto padded = model(ids, mask);
    CHECK(torch::allclose(padded.narrow(1, 0, 4), alone, 1e-4, 1e-5));
  }
  SECTION("left padding with verl's position ids") {
    auto ids = torch::tensor({{0, 0, 0, 4, 9, 16, 25}});
    auto mask = torch::tensor({{0, 0, 0, 1, 1, 1, 1}});
    auto padded = model(ids, mask, position_ids_from_mask(mask));
    CHECK(torch::allclose(padded.narrow(1, 3, 4), alone, 1e-4, 1e-5));
    CHECK(padded.isfinite().all().item<bool>());  // padding queries see no key: finite, not NaN
  }
}
