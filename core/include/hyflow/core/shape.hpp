#pragma once
// shape_of: a tensor's shape as text for error messages, "(2, 3)". A template over anything
// whose sizes() is a range of integers (at::Tensor), so core stays free of torch and every
// module that formats shapes (cuda, parallel) shares it without a new module edge.

#include <string>

namespace hyflow {

/// "(d0, d1, ...)" from t.sizes() (a range of integers); "()" for a 0-dim tensor.
template <class Sized>
std::string shape_of(const Sized& t) {
  std::string text = "(";
  const char* separator = "";
  for (auto size : t.sizes()) {
    text += separator + std::to_string(size);
    separator = ", ";
  }
  return text + ")";
}

}  // namespace hyflow
