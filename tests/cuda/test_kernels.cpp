// The token kernels against the ATen reference. The same source builds test_cuda_kernels_host
// (the host build of the kernels, in the normal suite) and test_cuda_kernels_device (the CUDA
// build, run where a device exists, reported as skipped elsewhere): kernel_backend.hpp.

#include "kernel_backend.hpp"

#include <hyflow/cuda/kernels.hpp>
#include <hyflow/cuda/sampling.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <tuple>

using namespace hyflow::cuda;
using kernel_test::Buffer;
using kernels::DType;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

at::Generator seeded(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

at::ScalarType scalar_type(DType d) {
  return d == DType::bf16 ? at::kBFloat16 : d == DType::f16 ? at::kHalf : at::kFloat;
}

/// Logits as the kernels see them: raw bytes of `dtype`, and their exact values as a tensor.
struct Logits {
  DType dtype;
  at::Tensor typed;  // (rows, vocab) of dtype, contiguous
  explicit Logits(const at::Tensor& values, DType d = DType::f32)
      : dtype(d), typed(values.to(scalar_type(d)).contiguous()) {}
  int64_t rows() const { return typed.size(0); }
  int64_t vocab() const { return typed.size(1); }
  at::Tensor values() const { return typed.to(at::kFloat); }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> b(static_cast<size_t>(typed.numel() * typed.element_size()));
    std::memcpy(b.data(), typed.data_ptr(), b.size());
    return b;
  }
  /// A kernel's arguments with the fields every kernel shares: these logits, copied to `at`.
  template <class Args>
  Args args(const void* at) const {
    Args a;
    a.logits = at;
    a.dtype = dtype;
    a.rows = rows();
    a.vocab = vocab();
    a.row_stride = vocab();
    return a;
  }
};

struct Scores {
  std::vector<float> log_probs, entropy, lse, mean;
};

Scores forward(const Logits& x, const std::vector<int64_t>& labels, float temperature = 1.0f) {
  const auto rows = static_cast<size_t>(x.rows());
  Buffer<unsigned char> logits(x.bytes());
  Buffer<int64_t> label_buf(labels);
  Buffer<float> lp(rows), ent(rows), lse(rows), mean(rows);
  auto a = x.args<kernels::ScoresForward>(logits.get());
  a.labels = label_buf.get();
  a.temperature = temperature;
  a.log_probs = lp.get();
  a.entropy = ent.get();
  a.lse = lse.get();
  a.mean_z = mean.get();
  kernel_test::run(a);
  return {lp.read(), ent.read(), lse.read(), mean.read()};
}

/// dlogits of sum g_lp * log_prob + g_ent * entropy, as float.
at::Tensor backward(const Logits& x, const std::vector<int64_t>& labels, const std::vector<float>& g_lp,
                    const std::vector<float>& g_ent, float temperature = 1.0f) {
  const Scores s = forward(x, labels, temperature);
  Buffer<unsigned char> logits(x.bytes());
  Buffer<int64_t> label_buf(labels);
  Buffer<float> glp(g_lp), gent(g_ent), lse(s.lse), mean(s.mean);
  Buffer<unsigned char> grad(x.bytes().size());
  auto a = x.args<kernels::ScoresBackward>(logits.get());
  a.labels = label_buf.get();
  a.temperature = temperature;
  a.grad_log_probs = glp.get();
  a.grad_entropy = gent.get();
  a.lse = lse.get();
  a.mean_z = mean.get();
  a.grad_logits = grad.get();
  kernel_test::run(a);
  auto bytes = grad.read();
  auto out = at::empty_like(x.typed);
  std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
  return out.to(at::kFloat);
}

/// Reference log-probs and entropy in double from the exact logits the kernel saw.
std::pair<at::Tensor, at::Tensor> reference_scores(const Logits& x, const std::vector<int64_t>& labels,
                                                   double temperature) {
  auto z = x.values().to(at::kDouble);
  auto zt = z / temperature;
  auto logp = zt.log_softmax(-1);
  auto lab = torch::tensor(labels, at::kLong).unsqueeze(-1);
  auto lp = logp.gather(-1, lab).squeeze(-1);
  auto p = logp.exp();
  auto ent = -(p * logp.masked_fill(p == 0, 0)).sum(-1);
  return {lp, ent};
}

at::Tensor tensor_of(const std::vector<float>& v) {
  return torch::tensor(v, at::kFloat);
}

std::vector<int64_t> random_labels(int64_t rows, int64_t vocab, uint64_t seed) {
  auto t = torch::randint(vocab, {rows}, seeded(seed));
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + rows);
}

struct Draw {
  float temperature = 1.0f;
  int64_t top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 1;
  uint64_t step = 0;
  std::vector<int64_t> row_ids;  // empty: row index
};

std::vector<int64_t> sample_rows(const Logits& x, const Draw& d) {
  Buffer<unsigned char> logits(x.bytes());
  Buffer<int64_t> ids(d.row_ids);
  Buffer<int64_t> tokens(static_cast<size_t>(x.rows()));
  auto a = x.args<kernels::SampleArgs>(logits.get());
  a.temperature_all = d.temperature;
  a.top_k_all = d.top_k;
  a.top_p_all = d.top_p;
  a.min_p_all = d.min_p;
  a.row_ids = d.row_ids.empty() ? nullptr : ids.get();
  a.seed = d.seed;
  a.step = d.step;
  a.tokens = tokens.get();
  kernel_test::run(a);
  return tokens.read();
}

SamplingOptions options_of(const Draw& d) {
  return SamplingOptions{.temperature = d.temperature, .top_k = d.top_k, .top_p = d.top_p, .min_p = d.min_p};
}

/// Upper critical value of chi-square with `df` degrees of freedom at about p = 1e-4
/// (Wilson-Hilferty).
double chi2_critical(int df) {
  const double k = df, z = 3.719;
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

}  // namespace

TEST_CASE("Philox4x32-10 on the backend reproduces the Random123 known-answer vectors") {
  // The expectations are the published vectors, not this project's code: on the device backend
  // the device computes them.
  INFO("backend " << kernel_test::backend_name());
  Buffer<uint32_t> in(std::vector<uint32_t>{0, 0, 0, 0, 0, 0, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u});
  Buffer<uint32_t> out(8);
  kernels::PrimitiveArgs a;
  a.n = 2;
  a.philox_in = in.get();
  a.philox_out = out.get();
  kernel_test::run(a);
  CHECK(out.read() == std::vector<uint32_t>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u, 0x408f276du,
                                            0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
}

TEST_CASE("16-bit conversions on the backend round to nearest even like ATen") {
  INFO("backend " << kernel_test::backend_name());
  auto x = torch::randn({4096}, seeded(40)) * 1000;
  x.index_put_({torch::indexing::Slice(0, 4)}, torch::tensor({65519.f, 65520.f, 1e-6f, -3e-8f}));
  const auto n = static_cast<size_t>(x.numel());
  Buffer<float> values(std::vector<float>(x.data_ptr<float>(), x.data_ptr<float>() + n));
  Buffer<uint16_t> bf(n), hf(n);
  Buffer<float> bf_back(n), hf_back(n);
  kernels::PrimitiveArgs a;
  a.n = x.numel();
  a.values = values.get();
  a.bf16 = bf.get();
  a.f16 = hf.get();
  a.bf16_back = bf_back.get();
  a.f16_back = hf_back.get();
  kernel_test::run(a);
  // ATen's conversions are the expectations
  auto want_bf = x.to(at::kBFloat16), want_hf = x.to(at::kHalf);
  const auto got_bf = bf.read(), got_hf = hf.read();
  const auto got_bf_back = bf_back.read(), got_hf_back = hf_back.read();
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint16_t b, h;
    std::memcpy(&b, static_cast<char*>(want_bf.data_ptr()) + 2 * i, 2);
    std::memcpy(&h, static_cast<char*>(want_hf.data_ptr()) + 2 * i, 2);
    bad += got_bf[i] != b;
    bad += got_hf[i] != h;
    bad += got_bf_back[i] != want_bf[static_cast<int64_t>(i)].item<float>();
    bad += got_hf_back[i] != want_hf[static_cast<int64_t>(i)].item<float>();
  }
  CHECK(bad == 0);
}

TEST_CASE("fused log-probs and entropy equal log_softmax and -sum p log p") {
  INFO("backend " << kernel_test::backend_name());
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t vocab : {1, 7, 256, 1000, 4099}) {  // vocab not a multiple of the 256-thread tile
      for (float temperature : {1.0f, 0.7f}) {
        Logits x(torch::randn({37, vocab}, seeded(static_cast<uint64_t>(vocab))) * 4, dtype);
        auto labels = random_labels(37, vocab, 7);
        auto got = forward(x, labels, temperature);
        auto [lp, ent] = reference_scores(x, labels, temperature);
        INFO("dtype " << static_cast<int>(dtype) << " vocab " << vocab << " temperature " << temperature);
        CHECK(torch::allclose(tensor_of(got.log_probs).to(at::kDouble), lp, 1e-4, 1e-4));
        CHECK(torch::allclose(tensor_of(got.entropy).to(at::kDouble), ent, 1e-4, 1e-4));
      }
    }
  }
}

TEST_CASE("-inf logits are tokens of probability 0 and an all -inf row gives NaN") {
  auto values = torch::randn({3, 300}, seeded(11));
  values.index_put_({0, torch::indexing::Slice(0, 150)}, -kInf);  // half the row masked
  values.index_put_({1, 299}, -kInf);
  values.index_put_({2}, -kInf);
  Logits x(values);
  std::vector<int64_t> labels{200, 299, 5};
  auto got = forward(x, labels);
  auto [lp, ent] = reference_scores(x, labels, 1.0);
  CHECK(got.log_probs[0] == Approx(lp[0].item<double>()).epsilon(1e-4));
  CHECK(got.entropy[0] == Approx(ent[0].item<double>()).epsilon(1e-4));
  CHECK(got.log_probs[1] == -kInf);  // the label itself is masked
  CHECK(got.entropy[1] == Approx(ent[1].item<double>()).epsilon(1e-4));
  CHECK(std::isnan(got.log_probs[2]));
  CHECK(std::isnan(got.entropy[2]));
}

TEST_CASE("a label outside the vocabulary gives a NaN log-prob, not a read out of bounds") {
  Logits x(torch::randn({2, 10}, seeded(12)));
  auto got = forward(x, {10, -1});
  CHECK(std::isnan(got.log_probs[0]));
  CHECK(std::isnan(got.log_probs[1]));
  CHECK(std::isfinite(got.entropy[0]));
}

TEST_CASE("the fused backward equals autograd through log_softmax and the entropy") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (float temperature : {1.0f, 0.6f}) {
      auto values = torch::randn({5, 777}, seeded(13)) * 3;
      values.index_put_({4, torch::indexing::Slice(0, 100)}, -kInf);
      Logits x(values, dtype);
      auto labels = random_labels(5, 777, 14);
      labels[4] = 500;
      std::vector<float> g_lp{1.0f, -0.5f, 0.0f, 2.0f, 0.3f}, g_ent{0.1f, 0.0f, -1.0f, 0.4f, 0.2f};
      auto got = backward(x, labels, g_lp, g_ent, temperature);
      auto leaf = x.values().to(at::kDouble).requires_grad_();
      auto logp = (leaf / static_cast<double>(temperature)).log_softmax(-1);
      auto p = logp.exp();
      auto lp = logp.gather(-1, torch::tensor(labels, at::kLong).unsqueeze(-1)).squeeze(-1);
      auto ent = -(p * logp.masked_fill(p == 0, 0)).sum(-1);
      ((lp * tensor_of(g_lp).to(at::kDouble)).sum() + (ent * tensor_of(g_ent).to(at::kDouble)).sum()).backward();
      const double tol = dtype == DType::f32 ? 1e-5 : 1e-2;
      INFO("dtype " << static_cast<int>(dtype) << " temperature " << temperature);
      CHECK(torch::allclose(got.to(at::kDouble), leaf.grad(), tol, tol));
      CHECK(got.index({4, torch::indexing::Slice(0, 100)}).abs().max().item<float>() == 0.0f);
    }
  }
}

TEST_CASE("the fused backward agrees with finite differences of the fused forward") {
  auto values = torch::randn({3, 9}, seeded(15));
  std::vector<int64_t> labels{2, 8, 0};
  std::vector<float> g_lp{1.0f, 0.5f, -1.0f}, g_ent{0.5f, -1.0f, 2.0f};
  auto grad = backward(Logits(values), labels, g_lp, g_ent);
  auto objective = [&](const at::Tensor& v) {
    auto s = forward(Logits(v), labels);
    double total = 0;
    for (size_t r = 0; r < 3; ++r) total += g_lp[r] * s.log_probs[r] + g_ent[r] * s.entropy[r];
    return total;
  };
  const double eps = 1e-2;
  double worst = 0;
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t j = 0; j < 9; ++j) {
      auto plus = values.clone(), minus = values.clone();
      plus.index_put_({r, j}, values[r][j].item<float>() + static_cast<float>(eps));
      minus.index_put_({r, j}, values[r][j].item<float>() - static_cast<float>(eps));
      const double numeric = (objective(plus) - objective(minus)) / (2 * eps);
      worst = std::max(worst, std::abs(numeric - grad[r][j].item<double>()));
    }
  }
  CHECK(worst < 2e-3);
}

TEST_CASE("greedy rows take the argmax with ties to the lowest id; invalid rows give -1") {
  auto values = torch::tensor(
      {{1.f, 3.f, 3.f, 2.f}, {-kInf, -kInf, 0.5f, -kInf}, {-kInf, -kInf, -kInf, -kInf}, {0.f, NAN, 1.f, 2.f}});
  for (DType dtype : {DType::f32, DType::bf16}) {
    auto tokens = sample_rows(Logits(values, dtype), Draw{.temperature = 0.0f});
    CHECK(tokens == std::vector<int64_t>{1, 2, -1, -1});
    tokens = sample_rows(Logits(values, dtype), Draw{.temperature = 1.0f});
    CHECK(tokens[1] == 2);  // the only finite token
    CHECK(tokens[2] == -1);
    CHECK(tokens[3] == -1);
  }
}

TEST_CASE("sampled frequencies pass a chi-square test against the filtered softmax") {
  const int64_t vocab = 61, draws = 20000;
  auto row = torch::randn({1, vocab}, seeded(16)) * 1.5;
  Logits x(row.expand({draws, vocab}));
  for (Draw d : {Draw{}, Draw{.temperature = 0.7f}, Draw{.top_k = 12}, Draw{.top_p = 0.8f}, Draw{.min_p = 0.05f},
                 Draw{.temperature = 1.3f, .top_k = 30, .top_p = 0.9f, .min_p = 0.01f}}) {
    d.seed = 99;
    auto tokens = sample_rows(x, d);
    auto filtered = filter_logits_rows(row, options_of(d));
    auto expected = filtered.to(at::kDouble).softmax(-1)[0] * static_cast<double>(draws);
    std::vector<double> counts(static_cast<size_t>(vocab), 0.0);
    for (auto t : tokens) {
      REQUIRE(t >= 0);
      REQUIRE(t < vocab);
      counts[static_cast<size_t>(t)] += 1;
    }
    double chi2 = 0, pooled_obs = 0, pooled_exp = 0;
    int cells = 0, outside = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const double e = expected[j].item<double>(), o = counts[static_cast<size_t>(j)];
      if (e == 0) {
        outside += o > 0;
        continue;
      }
      if (e < 5) {  // pool the rare tokens into one cell
        pooled_obs += o;
        pooled_exp += e;
        continue;
      }
      chi2 += (o - e) * (o - e) / e;
      ++cells;
    }
    if (pooled_exp > 0) {
      chi2 += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
      ++cells;
    }
    INFO("temperature " << d.temperature << " top_k " << d.top_k << " top_p " << d.top_p << " min_p " << d.min_p
                        << ": chi2 " << chi2 << " over " << cells << " cells");
    CHECK(outside == 0);
    CHECK(cells >= 2);
    CHECK(chi2 < chi2_critical(cells - 1));
  }
}

TEST_CASE("top-k keeps exactly the k largest, plus every token tied with the k-th") {
  auto row = torch::arange(0, 300, at::kFloat).unsqueeze(0) / 50.0;  // distinct, increasing
  auto tokens = sample_rows(Logits(row.expand({4000, 300})), Draw{.top_k = 3, .seed = 5});
  CHECK(std::set<int64_t>(tokens.begin(), tokens.end()) == std::set<int64_t>{297, 298, 299});
  auto tied = torch::tensor({{5.f, 4.f, 4.f, 4.f, 1.f, 0.f}});
  tokens = sample_rows(Logits(tied.expand({4000, 6})), Draw{.top_k = 2, .seed = 6});
  CHECK(std::set<int64_t>(tokens.begin(), tokens.end()) == std::set<int64_t>{0, 1, 2, 3});
}

TEST_CASE("top-p keeps the smallest prefix reaching p, and tokens tied at its edge together") {
  // probabilities 0.534, 0.197, 0.197, 0.072: p = 0.6 reaches past token 0 into the tied pair
  auto tied = torch::tensor({{2.f, 1.f, 1.f, 0.f}});
  auto tokens = sample_rows(Logits(tied.expand({4000, 4})), Draw{.top_p = 0.6f, .seed = 7});
  CHECK(std::set<int64_t>(tokens.begin(), tokens.end()) == std::set<int64_t>{0, 1, 2});
  tokens = sample_rows(Logits(tied.expand({4000, 4})), Draw{.top_p = 0.5f, .seed = 8});
  CHECK(std::set<int64_t>(tokens.begin(), tokens.end()) == std::set<int64_t>{0});
  auto kept = filter_logits_rows(tied, SamplingOptions{.top_p = 0.6}).isfinite();
  CHECK(torch::equal(kept[0], torch::tensor({true, true, true, false})));
}

TEST_CASE("min-p drops tokens below min_p times the most likely one") {
  auto probs = torch::tensor({0.6, 0.25, 0.1, 0.05}, at::kDouble);
  auto row = probs.log().to(at::kFloat).unsqueeze(0);  // threshold 0.2 * 0.6 = 0.12
  auto tokens = sample_rows(Logits(row.expand({4000, 4})), Draw{.min_p = 0.2f, .seed = 9});
  CHECK(std::set<int64_t>(tokens.begin(), tokens.end()) == std::set<int64_t>{0, 1});
}

TEST_CASE("-inf tokens are never drawn") {
  auto row = torch::zeros({1, 500});
  row.index_put_({0, torch::indexing::Slice(0, 499)}, -kInf);
  row.index_put_({0, 17}, 0.0f);
  auto tokens = sample_rows(Logits(row.expand({1000, 500})), Draw{.top_p = 0.9f, .seed = 10});
  CHECK(std::set<int64_t>(tokens.begin(), tokens.end()) == std::set<int64_t>{17, 499});
}

TEST_CASE("kernel tokens equal the reference's: same filters, same Philox race") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    // top_k 50 and 200: the candidates in shared memory; 1500: more than fit, the full passes
    for (Draw d : {Draw{}, Draw{.temperature = 0.8f, .top_k = 50}, Draw{.top_p = 0.9f},
                   Draw{.temperature = 1.2f, .top_k = 200, .top_p = 0.7f, .min_p = 0.02f},
                   Draw{.top_k = 1500, .top_p = 0.8f}, Draw{.top_k = 1500, .min_p = 0.01f}}) {
      d.seed = 1234;
      d.step = 17;
      Logits x(torch::randn({64, 3001}, seeded(20)) * 2.5, dtype);
      auto got = sample_rows(x, d);
      auto want = sample_seeded(x.typed, options_of(d), d.seed, d.step, {}, {}, Impl::reference);
      int mismatches = 0;
      for (int64_t r = 0; r < 64; ++r) mismatches += got[static_cast<size_t>(r)] != want[r].item<int64_t>();
      INFO("dtype " << static_cast<int>(dtype) << " top_k " << d.top_k << " top_p " << d.top_p);
      CHECK(mismatches <= 1);  // only a float tie at a filter edge could differ
    }
  }
}

TEST_CASE("a row's token depends on (seed, row id, step), not on its batch") {
  auto batch = torch::randn({8, 1000}, seeded(21));
  Draw d{.temperature = 0.9f, .top_p = 0.95f, .seed = 3, .step = 4, .row_ids = {10, 11, 12, 13, 14, 15, 16, 17}};
  auto all = sample_rows(Logits(batch), d);
  Draw alone = d;
  alone.row_ids = {13};
  auto one = sample_rows(Logits(batch.narrow(0, 3, 1)), alone);
  CHECK(one[0] == all[3]);
  CHECK(sample_rows(Logits(batch), d) == all);  // reproducible
  // another step draws differently (the logits are flat enough that 8 equal tokens are unlikely)
  Draw next = d;
  next.step = 5;
  CHECK(sample_rows(Logits(batch * 0.1), next) != sample_rows(Logits(batch * 0.1), d));
}

TEST_CASE("the kernels give the same results at every block size, and refuse one that is not a power of two") {
  INFO("backend " << kernel_test::backend_name());
  Logits x(torch::randn({6, 1001}, seeded(22)) * 3);
  auto labels = random_labels(6, 1001, 23);
  Buffer<unsigned char> logits(x.bytes());
  Buffer<int64_t> label_buf(labels);
  Buffer<float> lp(6);
  auto a = x.args<kernels::ScoresForward>(logits.get());
  a.labels = label_buf.get();
  a.log_probs = lp.get();
  kernel_test::run(a, 256);
  const auto base = lp.read();
  Buffer<int64_t> tokens(6);
  auto s = x.args<kernels::SampleArgs>(logits.get());
  s.top_p_all = 0.9f;
  s.top_k_all = 100;
  s.seed = 4;
  s.tokens = tokens.get();
  kernel_test::run(s, 256);
  const auto base_tokens = tokens.read();
  for (int threads : {1, 32, 1024}) {
    INFO("block threads " << threads);
    kernel_test::run(a, threads);
    const auto other = lp.read();
    for (size_t r = 0; r < 6; ++r) CHECK(other[r] == Approx(base[r]).epsilon(1e-5));
    kernel_test::run(s, threads);
    CHECK(tokens.read() == base_tokens);
  }
  CHECK_THROWS_WITH(kernel_test::run(a, 3), Catch::Contains("power of two"));
}

TEST_CASE("results do not depend on where a row starts (16-byte vectors or element loads)") {
  // On the device an aligned row is read in 16-byte vectors and a misaligned one element by
  // element, in the same order: the results must be equal bit for bit.
  INFO("backend " << kernel_test::backend_name());
  for (DType dtype : {DType::f32, DType::bf16}) {
    Logits x(torch::randn({5, 4096 + 24}, seeded(30)) * 3, dtype);  // a whole number of vectors, and a tail
    auto labels = random_labels(5, x.vocab(), 31);
    const auto bytes = x.bytes();
    const size_t width = dtype == DType::f32 ? 4 : 2;
    std::vector<unsigned char> shifted(width);  // one element before the rows: no row is 16-byte aligned
    shifted.insert(shifted.end(), bytes.begin(), bytes.end());
    Buffer<unsigned char> aligned_buf(bytes), shifted_buf(shifted);
    Buffer<int64_t> label_buf(labels);
    auto run_both = [&](const void* logits) {
      Buffer<float> lp(5), ent(5);
      Buffer<int64_t> tokens(5);
      auto f = x.args<kernels::ScoresForward>(logits);
      f.labels = label_buf.get();
      f.log_probs = lp.get();
      f.entropy = ent.get();
      kernel_test::run(f);
      auto s = x.args<kernels::SampleArgs>(logits);
      s.top_k_all = 40;
      s.top_p_all = 0.9f;
      s.seed = 8;
      s.tokens = tokens.get();
      kernel_test::run(s);
      return std::make_tuple(lp.read(), ent.read(), tokens.read());
    };
    const auto a = run_both(aligned_buf.get());
    const auto b = run_both(static_cast<const unsigned char*>(shifted_buf.get()) + width);
    CHECK(std::get<0>(a) == std::get<0>(b));
    CHECK(std::get<1>(a) == std::get<1>(b));
    CHECK(std::get<2>(a) == std::get<2>(b));
  }
}

TEST_CASE("the backward over several blocks per row equals one block, bit for bit") {
  // The device splits a row over several blocks at small batch; the host driver can be asked to.
  Logits x(torch::randn({3, 20000 + 5}, seeded(32)) * 2, DType::bf16);
  auto labels = random_labels(3, x.vocab(), 33);
  labels[1] = 19999;  // in the last segment
  const auto bytes = x.bytes();
  std::vector<float> g_lp{1.0f, -0.5f, 0.25f}, g_ent{0.1f, 0.3f, -0.2f};
  auto s = forward(x, labels);
  auto grad_with = [&](int segments) {
    std::vector<unsigned char> out(bytes.size());
    kernels::ScoresBackward a = x.args<kernels::ScoresBackward>(bytes.data());
    a.labels = labels.data();
    a.grad_log_probs = g_lp.data();
    a.grad_entropy = g_ent.data();
    a.lse = s.lse.data();
    a.mean_z = s.mean.data();
    a.grad_logits = out.data();
    kernels::host::scores_backward(a, 256, segments);
    return out;
  };
  const auto one = grad_with(1);
  CHECK(grad_with(3) == one);
  CHECK(grad_with(7) == one);
  CHECK_THROWS_WITH(grad_with(0), Catch::Contains("segments must be >= 1"));
}

TEST_CASE("the fused backward at a vocabulary the device splits over several blocks equals autograd") {
  INFO("backend " << kernel_test::backend_name());
  Logits x(torch::randn({2, 151936}, seeded(34)) * 3, DType::bf16);  // Qwen2's vocabulary, 2 rows
  auto labels = random_labels(2, x.vocab(), 35);
  std::vector<float> g_lp{1.0f, -0.7f}, g_ent{0.2f, 0.5f};
  auto got = backward(x, labels, g_lp, g_ent);
  auto leaf = x.values().to(at::kDouble).requires_grad_();
  auto logp = leaf.log_softmax(-1);
  auto p = logp.exp();
  auto lp = logp.gather(-1, torch::tensor(labels, at::kLong).unsqueeze(-1)).squeeze(-1);
  auto ent = -(p * logp.masked_fill(p == 0, 0)).sum(-1);
  ((lp * tensor_of(g_lp).to(at::kDouble)).sum() + (ent * tensor_of(g_ent).to(at::kDouble)).sum()).backward();
  CHECK(torch::allclose(got.to(at::kDouble), leaf.grad(), 1e-2, 1e-4));
}
