#pragma once
// Small builders shared by the trainer tests.

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <vector>

namespace hyflow::test {

inline at::Tensor f64(std::initializer_list<double> v) {
  return torch::tensor(std::vector<double>(v), torch::kDouble);
}
inline at::Tensor f64(std::initializer_list<std::initializer_list<double>> rows) {
  std::vector<at::Tensor> ts;
  for (auto r : rows) ts.push_back(torch::tensor(std::vector<double>(r), torch::kDouble));
  return torch::stack(ts);
}
/// A (n, 1) column: one score per row.
inline at::Tensor col(std::initializer_list<double> v) { return f64(v).unsqueeze(1); }
inline at::Tensor i64(std::initializer_list<std::initializer_list<int64_t>> rows) {
  std::vector<at::Tensor> ts;
  for (auto r : rows) ts.push_back(torch::tensor(std::vector<int64_t>(r), torch::kLong));
  return torch::stack(ts);
}

/// Every element of `actual` equals `expected` within `margin`.
inline void require_close(const at::Tensor& actual, const at::Tensor& expected, double margin = 1e-12) {
  REQUIRE(actual.sizes() == expected.sizes());
  auto a = actual.to(torch::kDouble).contiguous().reshape(-1);
  auto e = expected.to(torch::kDouble).contiguous().reshape(-1);
  for (int64_t i = 0; i < a.numel(); ++i) {
    INFO("element " << i);
    REQUIRE(a[i].item<double>() == Approx(e[i].item<double>()).margin(margin).epsilon(0));
  }
}

inline double scalar(const at::Tensor& t) { return t.item<double>(); }

}  // namespace hyflow::test
