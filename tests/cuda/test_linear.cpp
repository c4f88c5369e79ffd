#include <hyflow/core/error.hpp>
#include <hyflow/cuda/linear.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

using namespace hyflow::cuda;

namespace {

at::Generator seeded(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

bool close(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && torch::allclose(a, b, /*rtol=*/1e-5, /*atol=*/1e-5);
}

// Builds without oneDNN cannot run the values tests: there the functions must refuse.
bool have_onednn() {
  if (at::hasMKLDNN()) return true;
  WARN("LibTorch has no oneDNN: checking that the oneDNN linear refuses to run");
  auto x = torch::randn({2, 3});
  CHECK_THROWS_AS(onednn_linear(x, torch::randn({4, 3})), hyflow::ValueError);
  return false;
}

}  // namespace

TEST_CASE("oneDNN linear forward equals at::linear, with and without bias, for 2-D and 3-D inputs") {
  if (!have_onednn()) return;
  auto weight = torch::randn({7, 5}, seeded(1));
  auto bias = torch::randn({7}, seeded(2));
  for (auto x : {torch::randn({4, 5}, seeded(3)), torch::randn({2, 3, 5}, seeded(4))}) {
    CHECK(close(onednn_linear(x, weight, bias), at::linear(x, weight, bias)));
    CHECK(close(onednn_linear(x, weight), at::linear(x, weight)));
  }
  // A non-contiguous input (a transposed view) gives the same result as its contiguous copy.
  auto xt = torch::randn({5, 6}, seeded(5)).t();
  CHECK(close(onednn_linear(xt, weight, bias), at::linear(xt.contiguous(), weight, bias)));
}

TEST_CASE("oneDNN linear gradients equal those of at::linear") {
  if (!have_onednn()) return;
  for (bool with_bias : {true, false}) {
    INFO("bias: " << with_bias);
    auto x0 = torch::randn({2, 3, 6}, seeded(10));
    auto w0 = torch::randn({4, 6}, seeded(11));
    auto b0 = with_bias ? torch::randn({4}, seeded(12)) : at::Tensor();
    auto dy = torch::randn({2, 3, 4}, seeded(13));  // weights the outputs so every grad entry differs

    auto leaf = [](const at::Tensor& t) { return t.defined() ? t.clone().requires_grad_(true) : at::Tensor(); };
    auto x1 = leaf(x0), w1 = leaf(w0), b1 = leaf(b0);
    (onednn_linear(x1, w1, b1) * dy).sum().backward();
    auto x2 = leaf(x0), w2 = leaf(w0), b2 = leaf(b0);
    (at::linear(x2, w2, b2) * dy).sum().backward();

    CHECK(close(x1.grad(), x2.grad()));
    CHECK(close(w1.grad(), w2.grad()));
    if (with_bias) CHECK(close(b1.grad(), b2.grad()));
  }
}

TEST_CASE("oneDNN linear on a packed weight equals at::linear and records no graph") {
  if (!have_onednn()) return;
  auto weight = torch::randn({3, 8}, seeded(20)).requires_grad_(true);
  auto bias = torch::randn({3}, seeded(21));
  auto x = torch::randn({2, 4, 8}, seeded(22));
  torch::NoGradGuard no_grad;  // how inference uses it: the packed copy is not a leaf of any graph
  auto packed = pack_onednn_weight(weight);
  CHECK(packed.is_mkldnn());
  auto y = onednn_linear_packed(x, packed, bias);
  CHECK_FALSE(y.requires_grad());
  CHECK(close(y, at::linear(x, weight, bias)));
  CHECK(close(onednn_linear_packed(x, packed), at::linear(x, weight)));
}

TEST_CASE("oneDNN linear rejects inputs it cannot run and shapes that do not fit") {
  CHECK_FALSE(onednn_linear_supported(torch::randn({2, 3}, torch::kDouble)));
  CHECK(onednn_linear_supported(torch::randn({2, 3})) == at::hasMKLDNN());
  if (!have_onednn()) return;
  auto x = torch::randn({2, 3});
  auto weight = torch::randn({4, 3});
  CHECK_THROWS_AS(onednn_linear(x.to(torch::kDouble), weight.to(torch::kDouble)), hyflow::ValueError);
  CHECK_THROWS_AS(onednn_linear(torch::randn({2, 5}), weight), hyflow::ShapeError);
  CHECK_THROWS_AS(onednn_linear(x, weight, torch::randn({3})), hyflow::ShapeError);
  CHECK_THROWS_AS(onednn_linear_packed(x, weight), hyflow::ValueError);  // not packed
  CHECK_THROWS_AS(onednn_linear_packed(torch::randn({2, 5}), pack_onednn_weight(weight)), hyflow::ShapeError);
  CHECK_THROWS_WITH(onednn_linear(torch::randn({2, 5}), weight),
                    Catch::Contains("(2, 5)") && Catch::Contains("(4, 3)"));
}
