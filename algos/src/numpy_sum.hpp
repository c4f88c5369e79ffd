#pragma once
// numpy's float64 summation (pairwise, in blocks of 8 accumulators), so that means and
// standard deviations of metric lists round exactly as np.mean / np.std do.

#include <cmath>
#include <cstddef>
#include <vector>

namespace hyflow::algos::metric_utils::detail {

/// np.add.reduce on a contiguous float64 array: sequential below 8 values, eight interleaved
/// partial sums up to 128, halves (rounded to a multiple of 8) above.
inline double numpy_pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_pairwise_sum(a, n2) + numpy_pairwise_sum(a + n2, n - n2);
}

/// np.mean of a non-empty list.
inline double numpy_mean(const std::vector<double>& v) {
  return numpy_pairwise_sum(v.data(), v.size()) / static_cast<double>(v.size());
}

/// np.std (population): sqrt(mean((x - mean)²)).
inline double numpy_std(const std::vector<double>& v) {
  const double m = numpy_mean(v);
  std::vector<double> sq(v.size());
  for (size_t i = 0; i < v.size(); ++i) sq[i] = (v[i] - m) * (v[i] - m);
  return std::sqrt(numpy_mean(sq));
}

}  // namespace hyflow::algos::metric_utils::detail
