#include <hyflow/cuda/log_probs.hpp>

#include <hyflow/core/error.hpp>

#include <string>
#include <vector>

namespace hyflow::cuda {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + ")";
}

void check_chunk(int64_t chunk_rows, const char* what) {
  if (chunk_rows <= 0) {
    throw ValueError(std::string(what) + ": chunk_rows must be > 0, got " + std::to_string(chunk_rows));
  }
}

// Entropy of rows of a 2-D float32 tensor.
at::Tensor entropy_rows(const at::Tensor& z) {
  auto lse = z.logsumexp(-1);
  return lse - (z.softmax(-1) * z).sum(-1);
}

}  // namespace

at::Tensor log_probs_from_logits(const at::Tensor& logits, const at::Tensor& labels, int64_t chunk_rows) {
  check_chunk(chunk_rows, "log_probs_from_logits");
  if (logits.dim() < 1 || labels.sizes() != logits.sizes().slice(0, logits.dim() - 1)) {
    throw ShapeError("log_probs_from_logits: logits " + shape_of(logits) +
                     " need labels of shape logits.shape[:-1], got " + shape_of(labels));
  }
  const int64_t vocab = logits.size(-1);
  auto flat = logits.reshape({-1, vocab});                   // (N, V)
  auto flat_labels = labels.reshape({-1, 1}).to(at::kLong);  // (N, 1)
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < flat.size(0); start += chunk_rows) {
    auto z = flat.narrow(0, start, std::min(chunk_rows, flat.size(0) - start)).to(at::kFloat);
    auto picked = z.gather(-1, flat_labels.narrow(0, start, z.size(0))).squeeze(-1);
    parts.push_back(picked - z.logsumexp(-1));
  }
  if (parts.empty()) return at::empty(labels.sizes(), logits.options().dtype(at::kFloat));
  return at::cat(parts).reshape(labels.sizes());
}

at::Tensor entropy_from_logits(const at::Tensor& logits) {
  if (logits.dim() < 1) throw ShapeError("entropy_from_logits: logits must have a vocab dim");
  return entropy_rows(logits.to(at::kFloat));
}

at::Tensor entropy_from_logits_chunked(const at::Tensor& logits, int64_t chunk_rows) {
  check_chunk(chunk_rows, "entropy_from_logits_chunked");
  if (logits.dim() < 1) throw ShapeError("entropy_from_logits_chunked: logits must have a vocab dim");
  auto flat = logits.reshape({-1, logits.size(-1)});  // (N, V)
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < flat.size(0); start += chunk_rows) {
    auto z = flat.narrow(0, start, std::min(chunk_rows, flat.size(0) - start)).to(at::kFloat);
    parts.push_back(entropy_rows(z));
  }
  auto out_shape = logits.sizes().slice(0, logits.dim() - 1);
  if (parts.empty()) return at::empty(out_shape, logits.options().dtype(at::kFloat));
  return at::cat(parts).reshape(out_shape);
}

}  // namespace hyflow::cuda
