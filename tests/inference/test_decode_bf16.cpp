// The decode engine in bf16 (DecodeDtype::kBFloat16): the bf16 GEMM against a reference built from
// ATen ops (bf16 inputs, float32 sums), a check that a wrong weight layout fails that reference, the
// AVX-512 BF16 build against the portable one, and the engine's two bf16 backends against float32.
#include "../../inference/src/decode/kernels.hpp"
#include "decode_test_util.hpp"

#include <hyflow/inference/decode_engine.hpp>
#include <hyflow/inference/generation.hpp>

#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <cstring>
#include <vector>

using namespace hyflow;
using namespace hyflow::models;
using namespace hyflow::inference;
using namespace hyflow::testing;

namespace {

// Allows or forbids vdpbf16ps for a scope.
struct Bf16Dot {
  explicit Bf16Dot(bool allow) { decode::allow_bf16_dot(allow); }
  Bf16Dot(const Bf16Dot&) = delete;
  Bf16Dot& operator=(const Bf16Dot&) = delete;
  ~Bf16Dot() { decode::allow_bf16_dot(true); }
};

// The builds of linear_bf16 this CPU runs: the portable one, and vdpbf16ps where it has it.
std::vector<bool> dot_builds() {
  std::vector<bool> out{false};
  if (decode::cpu_has_bf16_dot()) out.push_back(true);
  return out;
}

std::vector<uint32_t> pack_bf16(const at::Tensor& w) {
  const int64_t out = w.size(0), in = w.size(1);
  std::vector<uint32_t> packed(static_cast<size_t>(decode::packed_bf16_words(in, out)));
  decode::pack_weight_bf16(w.contiguous().data_ptr<float>(), in, out, packed.data());
  return packed;
}

// y = x W^T + b through linear_bf16 on a given packed copy of an (out, in) weight.
at::Tensor bf16_linear(const at::Tensor& x, const std::vector<uint32_t>& packed, const at::Tensor& bias, int64_t out) {
  auto y = torch::zeros({x.size(0), out});
  decode::linear_bf16(x.data_ptr<float>(), x.size(1), x.size(0), packed.data(), bias.data_ptr<float>(), x.size(1), out,
                      y.data_ptr<float>(), out, false);
  return y;
}

// The reference: x and W rounded to bf16 by ATen, multiplied and summed in float32 (double here, so the
// reference's own rounding does not count), plus b.
at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const auto xb = x.to(torch::kBFloat16).to(torch::kDouble), wb = w.to(torch::kBFloat16).to(torch::kDouble);
  return (at::matmul(xb, wb.t()) + b.to(torch::kDouble)).to(torch::kFloat);
}

// The largest |y - ref| relative to the bound of float32 summation: in * 2^-23 * sum_k |x_k w_k| (+ |b|).
double error_ratio(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const auto ref = reference(x, w, b).to(torch::kDouble);
  const auto xb = x.to(torch::kBFloat16).to(torch::kDouble), wb = w.to(torch::kBFloat16).to(torch::kDouble);
  const auto scale = at::matmul(xb.abs(), wb.abs().t()) + b.to(torch::kDouble).abs();
  const double bound_per_unit = static_cast<double>(x.size(1) + 1) * std::ldexp(1.0, -23);
  return ((y.to(torch::kDouble) - ref).abs() / (scale * bound_per_unit + 1e-30)).max().item<double>();
}

}  // namespace

TEST_CASE("bf16 rounding: nearest even, exact round trip of bf16 values, NaN stays NaN") {
  CHECK(decode::to_bf16(1.0F) == 0x3F80);
  // 1 + 2^-8 is halfway between two bf16 values: ties to the even one (1.0); just above, up.
  CHECK(decode::to_bf16(1.0F + std::ldexp(1.0F, -8)) == 0x3F80);
  CHECK(decode::to_bf16(1.0F + std::ldexp(1.0F, -8) + std::ldexp(1.0F, -20)) == 0x3F81);
  CHECK(decode::to_bf16(1.0F + 3 * std::ldexp(1.0F, -8)) == 0x3F82);  // halfway, odd below: up to even
  CHECK(std::isnan(decode::from_bf16(decode::to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (float v : {0.5F, -3.25F, 1e-3F, 123456.0F}) {
    const auto b = decode::to_bf16(v);
    CHECK(decode::to_bf16(decode::from_bf16(b)) == b);
  }
  // agrees with ATen's conversion
  const auto t = torch::randn({4096}) * 100;
  const auto aten = t.to(torch::kBFloat16).to(torch::kFloat);
  for (int64_t i = 0; i < t.numel(); ++i) {
    REQUIRE(decode::from_bf16(decode::to_bf16(t[i].item<float>())) == aten[i].item<float>());
  }
}

TEST_CASE("the bf16 GEMM equals the ATen reference (bf16 inputs, float32 sums) on odd shapes, both builds") {
  torch::manual_seed(7);
  for (const auto dot : dot_builds()) {
    Bf16Dot mode(dot);
    for (const auto& [rows, in, out] : {std::tuple{1, 37, 53}, {3, 64, 16}, {9, 129, 70}, {17, 256, 100}}) {
      INFO((dot ? "vdpbf16ps" : "portable") << " rows " << rows << " in " << in << " out " << out);
      const auto x = torch::randn({rows, in}), w = torch::randn({out, in}), b = torch::randn({out});
      const auto y = bf16_linear(x, pack_bf16(w), b, out);
      CHECK(error_ratio(y, x, w, b) <= 1.0);
      // accumulate adds to what y holds (the fused residual add)
      auto acc = torch::ones({rows, out});
      decode::linear_bf16(x.data_ptr<float>(), in, rows, pack_bf16(w).data(), b.data_ptr<float>(), in, out,
                          acc.data_ptr<float>(), out, true);
      CHECK(torch::allclose(acc, y + 1, 1e-5, 1e-5));
    }
  }
}

TEST_CASE("a wrong bf16 weight layout fails the reference check (the check can fail)") {
  torch::manual_seed(8);
  const int64_t rows = 4, n = 64;
  const auto x = torch::randn({rows, n}), w = torch::randn({n, n}), b = torch::randn({n});
  for (const auto dot : dot_builds()) {
    Bf16Dot mode(dot);
    INFO((dot ? "vdpbf16ps" : "portable"));
    CHECK(error_ratio(bf16_linear(x, pack_bf16(w), b, n), x, w, b) <= 1.0);
    // transposed: W^T packed where W belongs
    CHECK(error_ratio(bf16_linear(x, pack_bf16(w.t().contiguous()), b, n), x, w, b) > 1e3);
    // two output rows swapped
    auto swapped = w.clone();
    swapped[3].copy_(w[40]);
    swapped[40].copy_(w[3]);
    CHECK(error_ratio(bf16_linear(x, pack_bf16(swapped), b, n), x, w, b) > 1e3);
    // the two halves of each pair exchanged (k and k + 1 swapped)
    auto pairs = pack_bf16(w);
    for (auto& word : pairs) word = (word >> 16) | (word << 16);
    CHECK(error_ratio(bf16_linear(x, pairs, b, n), x, w, b) > 1e3);
  }
}

TEST_CASE("the vdpbf16ps build and the portable build of the bf16 GEMM agree") {
  if (!decode::cpu_has_bf16_dot()) {
    WARN("this CPU has no AVX-512 BF16: only the portable build runs");
    return;
  }
  torch::manual_seed(9);
  for (const auto& [rows, in, out] : {std::tuple{1, 288, 288}, {8, 768, 100}, {13, 61, 47}}) {
    INFO("rows " << rows << " in " << in << " out " << out);
    const auto x = torch::randn({rows, in}), w = torch::randn({out, in}) * 0.05, b = torch::randn({out});
    const auto packed = pack_bf16(w);
    at::Tensor fast, portable;
    {
      Bf16Dot mode(true);
      fast = bf16_linear(x, packed, b, out);
    }
    {
      Bf16Dot mode(false);
      portable = bf16_linear(x, packed, b, out);
    }
    // Both compute each pair's two products and adds in vdpbf16ps's order: equal up to how the hardware
    // rounds its pair sum (docs/inference.md, "bf16"), far inside the reference bound.
    CHECK(error_ratio(fast, x, w, b) <= 1.0);
    CHECK(error_ratio(portable, x, w, b) <= 1.0);
    const double diff = (fast - portable).abs().max().item<double>();
    const double scale = portable.abs().max().item<double>();
    CHECK(diff <= 1e-6 * scale);
  }
}

TEST_CASE("the batch-1 bf16 GEMV equals its row of a multi-row call bit for bit, both builds, 1 to 3 threads") {
  // in around 2 x 64 (the pairs of k fetched ahead), odd in (a last pair with one k); out with whole
  // groups of 8 panels, a short group and a partial panel.
  torch::manual_seed(12);
  for (const auto dot : dot_builds()) {
    Bf16Dot mode(dot);
    for (const auto& [in, out] : {std::pair{5, 16 * 8 * 2 + 16 * 3 + 5}, {127, 128}, {129, 17}, {131, 300},
                                  {400, 16 * 8 * 3 + 1}}) {
      const auto x = torch::randn({5, in}), w = torch::randn({out, in}), b = torch::randn({out});
      const auto packed = pack_bf16(w);
      const auto all = bf16_linear(x, packed, b, out);
      CHECK(error_ratio(all, x, w, b) <= 1.0);
      for (int threads : {1, 2, 3}) {
        INFO((dot ? "vdpbf16ps" : "portable") << " in " << in << " out " << out << ", " << threads << " threads");
        const int before = at::get_num_threads();
        at::set_num_threads(threads);
        for (int64_t r : {0, 4}) {
          const auto one = bf16_linear(x.narrow(0, r, 1).contiguous(), packed, b, out);
          CHECK(torch::equal(one, all.narrow(0, r, 1)));
        }
        at::set_num_threads(before);
      }
    }
  }
}

TEST_CASE("the bf16 GEMM rounds its activations as to_bf16 in every kernel build (ties, NaN, tails)") {
  // The AVX-512 build converts 16 activations at a time: its results equal the AVX2 build's, whose
  // conversion is to_bf16 element by element; x holds ties of the rounding (1 + 2^-8: down to even,
  // 1 + 3 * 2^-8: up to even) and a NaN, in is not a multiple of 16.
  if (decode::best_kernel_isa() != decode::Isa::kAvx512) {
    WARN("this CPU has no AVX-512: only the element-by-element conversion runs");
    return;
  }
  torch::manual_seed(13);
  const int64_t in = 16 * 5 + 7, out = 40;
  auto x = torch::randn({3, in});
  x[0][1] = 1.0F + std::ldexp(1.0F, -8);
  x[0][2] = 1.0F + 3 * std::ldexp(1.0F, -8);
  x[1][20] = -1.0F - std::ldexp(1.0F, -8);
  x[1][33] = 1.0F + std::ldexp(1.0F, -8) + std::ldexp(1.0F, -20);
  x[2][5] = std::numeric_limits<float>::quiet_NaN();
  const auto w = torch::randn({out, in}), b = torch::randn({out});
  const auto packed = pack_bf16(w);
  for (const auto dot : dot_builds()) {
    Bf16Dot mode(dot);
    INFO((dot ? "vdpbf16ps" : "portable"));
    const auto avx512 = bf16_linear(x, packed, b, out);
    decode::limit_kernel_isa(decode::Isa::kAvx2);
    const auto avx2 = bf16_linear(x, packed, b, out);
    decode::limit_kernel_isa(decode::Isa::kAvx512);
    CHECK(torch::equal(avx512.narrow(0, 0, 2), avx2.narrow(0, 0, 2)));
    CHECK(avx512[2].isnan().all().item<bool>());
    CHECK(avx2[2].isnan().all().item<bool>());
    // the ties rounded to even: against the reference on the rows without NaN
    CHECK(error_ratio(avx512.narrow(0, 0, 2), x.narrow(0, 0, 2), w, b) <= 1.0);
  }
}

TEST_CASE("attention over a bf16 KV cache equals attention over its float32 widening, every build") {
  // A paged cache (block, kv head, position in block, dim) of 3 rows with GQA 6 / 2, head dims with
  // and without a tail of 16, odd block sizes; row r attends to lengths[r] positions through its table.
  torch::manual_seed(10);
  for (const auto& [dim, block_size] : {std::pair<int64_t, int64_t>{64, 16}, {10, 5}, {40, 7}}) {
    const int64_t heads = 6, kv_heads = 2, rows = 3, blocks = 36;  // 12 per row: 50 positions at block size 5
    const std::vector<int64_t> lengths{1, 37, 50};
    const auto keys = torch::randn({blocks, kv_heads, block_size, dim});
    const auto values = torch::randn({blocks, kv_heads, block_size, dim});
    // the bf16 cache and the float32 values it stands for
    auto to_words = [](const at::Tensor& t) {
      std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
      const float* p = t.data_ptr<float>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = decode::to_bf16(p[i]);
      return out;
    };
    const auto kb = to_words(keys), vb = to_words(values);
    const auto kf = keys.to(torch::kBFloat16).to(torch::kFloat), vf = values.to(torch::kBFloat16).to(torch::kFloat);
    std::vector<std::vector<int32_t>> table(rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < blocks / rows; ++b) table[r].push_back(static_cast<int32_t>((b * rows + r * 5) % blocks));
    }
    const std::vector<const int32_t*> tables{table[0].data(), table[1].data(), table[2].data()};
    const auto q = torch::randn({rows, heads * dim});
    auto reference = torch::zeros({rows, heads * dim});
    decode::attend_rows(q.data_ptr<float>(), kf.data_ptr<float>(), vf.data_ptr<float>(), tables.data(), lengths.data(),
                        rows, heads, kv_heads, dim, block_size, reference.data_ptr<float>());
    for (const auto isa : {decode::Isa::kAvx512, decode::Isa::kPortable}) {
      if (isa > decode::best_kernel_isa()) continue;
      INFO("dim " << dim << " block " << block_size << " " << decode::isa_name(isa));
      decode::limit_kernel_isa(isa);
      auto out = torch::zeros({rows, heads * dim});
      decode::attend_rows_bf16(q.data_ptr<float>(), kb.data(), vb.data(), tables.data(), lengths.data(), rows, heads,
                               kv_heads, dim, block_size, out.data_ptr<float>());
      decode::limit_kernel_isa(decode::Isa::kAvx512);
      CHECK(torch::allclose(out, reference, 1e-4, 1e-5));
      // the check can fail: the cache's keys read as its values
      auto swapped = torch::zeros({rows, heads * dim});
      decode::attend_rows_bf16(q.data_ptr<float>(), vb.data(), kb.data(), tables.data(), lengths.data(), rows, heads,
                               kv_heads, dim, block_size, swapped.data_ptr<float>());
      CHECK_FALSE(torch::allclose(swapped, reference, 1e-2, 1e-2));
    }
  }
}

TEST_CASE("bf16 decode engines (CPU kernels and ATen) track the float32 engine's log-probs") {
  for (const auto& config : {llama_config(), qwen2_config()}) {
    INFO(config.architecture);
    auto model = make_model(config, 31);
    const DecodeSampling sampling{.sampling = {.temperature = 1.0}, .seed = 4, .return_log_probs = true};
    const std::vector<DecodeRequest> requests{DecodeRequest{.prompt = {4, 5, 6, 7, 8}, .n = 3, .max_new_tokens = 12},
                                              DecodeRequest{.prompt = {9}, .n = 2, .max_new_tokens = 12}};
    DecodeEngine fp32(model);
    const auto base = fp32.run(requests, sampling);
    for (const auto backend : {DecodeBackend::kKernels, DecodeBackend::kAten}) {
      const bool kernels = backend == DecodeBackend::kKernels;
      for (const auto dot : kernels ? dot_builds() : std::vector<bool>{true}) {
        INFO((kernels ? "kernels" : "aten") << (dot ? "" : " portable"));
        Bf16Dot mode(dot);
        DecodeEngine bf16(model, DecodeEngineOptions{.backend = backend, .dtype = DecodeDtype::kBFloat16});
        REQUIRE(bf16.backend() == backend);
        const auto outputs = bf16.run(requests, sampling);
        // the weights are cast once: about half the float32 copy's bytes (ATen: every parameter); the KV
        // blocks are half the float32 ones
        CHECK(bf16.stats().packed_weights > 0);
        CHECK(bf16.packed_bytes() * 10 <= fp32.packed_bytes() * 6);
        CHECK(bf16.stats().kv_block_bytes * 2 == fp32.stats().kv_block_bytes);
        CHECK(bf16.kv_pool_bytes() * 2 == fp32.kv_pool_bytes());
        // The engine's own log-probs of its own tokens against the float32 model's: close (bf16 has 8 bits
        // of mantissa) but not equal.
        double worst = 0.0, total = 0.0;
        int64_t count = 0;
        REQUIRE(outputs.size() == base.size());
        for (size_t i = 0; i < outputs.size(); ++i) {
          REQUIRE(outputs[i].log_probs.size() == outputs[i].tokens.size());
          for (float lp : outputs[i].log_probs) CHECK(std::isfinite(lp));
        }
        // Score the bf16 tokens with the float32 model (compute_response_scores on one prompt at a time).
        for (size_t r = 0, o = 0; r < requests.size(); ++r) {
          for (int64_t j = 0; j < requests[r].n; ++j, ++o) {
            const auto& out = outputs[o];
            std::vector<int64_t> ids = requests[r].prompt;
            ids.insert(ids.end(), out.tokens.begin(), out.tokens.end());
            const auto P = static_cast<int64_t>(requests[r].prompt.size());
            const auto T = static_cast<int64_t>(ids.size());
            torch::NoGradGuard g;
            const auto logits = model->forward(torch::tensor(ids).unsqueeze(0)).select(0, 0);  // (T, vocab)
            const auto lsm = torch::log_softmax(logits.narrow(0, P - 1, T - P), -1);
            for (int64_t t = 0; t < T - P; ++t) {
              const double ref = lsm[t][out.tokens[static_cast<size_t>(t)]].item<double>();
              const double d = std::abs(ref - out.log_probs[static_cast<size_t>(t)]);
              worst = std::max(worst, d);
              total += d;
              ++count;
            }
          }
        }
        INFO("max |dlogp| " << worst << " mean " << total / count);
        // The ATen forward also rounds its activations (norm outputs, attention, MLP) to bf16 between ops.
        CHECK(worst < (kernels ? 0.15 : 0.5));
        CHECK(total / count < (kernels ? 0.03 : 0.06));
        CHECK(worst > 0.0);  // the bf16 forward is not the float32 one
      }
    }
  }
}

TEST_CASE("a bf16 model decodes on the CPU kernels as a bf16 engine does on its float32 widening, token for token") {
  for (const auto& config : {llama_config(), qwen2_config()}) {
    INFO(config.architecture);
    auto model = make_model(config, 41);
    model->to(torch::kBFloat16);
    auto widened = make_model(config, 41);  // the same modules; parameters set to the bf16 ones below
    auto widen = [&] {
      torch::NoGradGuard g;
      const auto from = model->parameters();
      auto to = widened->parameters();
      for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i].to(torch::kFloat));
    };
    widen();
    CHECK(DecodeEngine::kernels_support(model));
    DecodeEngine engine(model);  // kAuto, the model's own dtype
    REQUIRE(engine.backend() == DecodeBackend::kKernels);
    DecodeEngine reference(widened, DecodeEngineOptions{.dtype = DecodeDtype::kBFloat16});
    const std::vector<DecodeRequest> requests{DecodeRequest{.prompt = {4, 5, 6, 7, 8}, .n = 2, .max_new_tokens = 10},
                                              DecodeRequest{.prompt = {9}, .max_new_tokens = 10}};
    auto same = [&](const std::vector<DecodeOutput>& a, const std::vector<DecodeOutput>& b) {
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        CHECK(a[i].tokens == b[i].tokens);
        CHECK(a[i].log_probs == b[i].log_probs);
      }
    };
    const DecodeSampling greedy{.sampling = {.greedy = true}, .return_log_probs = true};
    const DecodeSampling sampled{.sampling = {.temperature = 1.0}, .seed = 5, .return_log_probs = true};
    const auto before = engine.run(requests, greedy);
    same(before, reference.run(requests, greedy));
    same(engine.run(requests, sampled), reference.run(requests, sampled));
    // the bf16 weights packed as they are: the packed copy is the float32 widening's bf16 packing (bytes)
    CHECK(engine.packed_bytes() > reference.packed_bytes());  // plus the widened embedding, norms, biases
    // an in-place update of a norm (an optimizer step) reaches the engine's widened copy
    {
      torch::NoGradGuard g;
      model->model->norm->weight.mul_(-2.0);
    }
    widen();
    const auto after = engine.run(requests, greedy);
    same(after, reference.run(requests, greedy));
    CHECK(after[0].log_probs != before[0].log_probs);
  }
}

TEST_CASE("a bf16 engine casts again only the weights that changed (once per weight version)") {
  auto model = make_model(qwen2_config(), 32);
  const DecodeSampling sampling{.sampling = {.greedy = true}};
  const std::vector<DecodeRequest> requests{DecodeRequest{.prompt = {4, 5, 6}, .n = 1, .max_new_tokens = 6}};
  for (const auto backend : {DecodeBackend::kKernels, DecodeBackend::kAten}) {
    INFO((backend == DecodeBackend::kKernels ? "kernels" : "aten"));
    DecodeEngine engine(model, DecodeEngineOptions{.backend = backend, .dtype = DecodeDtype::kBFloat16});
    engine.run(requests, sampling);
    const int64_t all = engine.stats().packed_weights;
    CHECK(all > 0);
    engine.run(requests, sampling);
    CHECK(engine.stats().packed_weights == 0);
    {
      torch::NoGradGuard g;
      model->named_parameters()["model.layers.1.mlp.down_proj.weight"].mul_(0.0);
    }
    const auto changed = engine.run(requests, sampling);
    CHECK(engine.stats().packed_weights == 1);
    // the new weight is used: a fresh engine gives the same tokens
    DecodeEngine fresh(model, DecodeEngineOptions{.backend = backend, .dtype = DecodeDtype::kBFloat16});
    CHECK(fresh.run(requests, sampling)[0].tokens == changed[0].tokens);
    engine.drop_packed_weights();
    engine.run(requests, sampling);
    CHECK(engine.stats().packed_weights == all);
  }
}
