#include <hyflow/cuda/log_probs.hpp>

#include "torch_device.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/core/shape.hpp>
#include <hyflow/cuda/kernels.hpp>

#include <torch/autograd.h>

#include <string>
#include <vector>

namespace hyflow::cuda {
namespace {

void check_chunk(int64_t chunk_rows, const char* what) {
  if (chunk_rows <= 0) {
    throw ValueError(std::string(what) + ": chunk_rows must be > 0, got " + std::to_string(chunk_rows));
  }
}

void check_labels_shape(const at::Tensor& logits, const at::Tensor& labels, const char* what) {
  if (logits.dim() < 1 || labels.sizes() != logits.sizes().slice(0, logits.dim() - 1)) {
    throw ShapeError(std::string(what) + ": logits " + shape_of(logits) +
                     " need labels of shape logits.shape[:-1], got " + shape_of(labels));
  }
}

// --- the ATen reference ----------------------------------------------------------------------

// Entropy of rows of a 2-D float32 tensor; tokens of probability 0 contribute 0 (not 0 * -inf).
at::Tensor entropy_rows(const at::Tensor& z) {
  auto lse = z.logsumexp(-1);
  auto p = z.softmax(-1);
  return lse - (p * z.masked_fill(p == 0, 0)).sum(-1);
}

at::Tensor reference_log_probs(const at::Tensor& logits, const at::Tensor& labels, int64_t chunk_rows,
                               double temperature) {
  const int64_t vocab = logits.size(-1);
  auto flat = logits.reshape({-1, vocab});                   // (N, V)
  auto flat_labels = labels.reshape({-1, 1}).to(at::kLong);  // (N, 1)
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < flat.size(0); start += chunk_rows) {
    auto z = flat.narrow(0, start, std::min(chunk_rows, flat.size(0) - start)).to(at::kFloat);
    if (temperature != 1.0) z = z / temperature;
    auto picked = z.gather(-1, flat_labels.narrow(0, start, z.size(0))).squeeze(-1);
    parts.push_back(picked - z.logsumexp(-1));
  }
  if (parts.empty()) return at::empty(labels.sizes(), logits.options().dtype(at::kFloat));
  return at::cat(parts).reshape(labels.sizes());
}

at::Tensor reference_entropy(const at::Tensor& logits, int64_t chunk_rows, double temperature) {
  auto flat = logits.reshape({-1, logits.size(-1)});  // (N, V)
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < flat.size(0); start += chunk_rows) {
    auto z = flat.narrow(0, start, std::min(chunk_rows, flat.size(0) - start)).to(at::kFloat);
    if (temperature != 1.0) z = z / temperature;
    parts.push_back(entropy_rows(z));
  }
  auto out_shape = logits.sizes().slice(0, logits.dim() - 1);
  if (parts.empty()) return at::empty(out_shape, logits.options().dtype(at::kFloat));
  return at::cat(parts).reshape(out_shape);
}

// --- the fused kernel ------------------------------------------------------------------------

// logits (N, V) contiguous, labels (N,) int64 contiguous, on the same device.
std::vector<at::Tensor> run_forward(const at::Tensor& logits, const at::Tensor& labels, double temperature) {
  const auto f32 = logits.options().dtype(at::kFloat);
  const int64_t rows = logits.size(0);
  auto log_probs = at::empty({rows}, f32), entropy = at::empty({rows}, f32);
  auto lse = at::empty({rows}, f32), mean = at::empty({rows}, f32);
  auto a = detail::logits_args<kernels::ScoresForward>(logits);
  a.labels = labels.data_ptr<int64_t>();
  a.temperature = static_cast<float>(temperature);
  a.log_probs = log_probs.data_ptr<float>();
  a.entropy = entropy.data_ptr<float>();
  a.lse = lse.data_ptr<float>();
  a.mean_z = mean.data_ptr<float>();
  detail::launch(logits, "log_probs_and_entropy", a, kernels::host::scores_forward, kernels::device::scores_forward);
  return {log_probs, entropy, lse, mean};
}

at::Tensor run_backward(const at::Tensor& logits, const at::Tensor& labels, double temperature, const at::Tensor& g_lp,
                        const at::Tensor& g_ent, const at::Tensor& lse, const at::Tensor& mean) {
  auto grad = at::empty_like(logits, at::MemoryFormat::Contiguous);
  auto a = detail::logits_args<kernels::ScoresBackward>(logits);
  a.labels = labels.data_ptr<int64_t>();
  a.temperature = static_cast<float>(temperature);
  at::Tensor glp, gent;
  if (g_lp.defined()) glp = g_lp.to(at::kFloat).contiguous(), a.grad_log_probs = glp.data_ptr<float>();
  if (g_ent.defined()) gent = g_ent.to(at::kFloat).contiguous(), a.grad_entropy = gent.data_ptr<float>();
  a.lse = lse.data_ptr<float>();
  a.mean_z = mean.data_ptr<float>();
  a.grad_logits = grad.data_ptr();
  // the host build in one segment per row (the device splits rows at small batch itself)
  auto host = +[](const kernels::ScoresBackward& args, int threads) { kernels::host::scores_backward(args, threads); };
  detail::launch(logits, "log_probs_and_entropy (backward)", a, host, kernels::device::scores_backward);
  return grad;
}

/// Autograd node of the fused kernel: saves the logits and two floats per row.
class FusedScores : public torch::autograd::Function<FusedScores> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                                const at::Tensor& labels, double temperature) {
    auto out = run_forward(logits, labels, temperature);
    ctx->save_for_backward({logits, labels, out[2], out[3]});
    ctx->saved_data["temperature"] = temperature;
    ctx->mark_non_differentiable({out[2], out[3]});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const double temperature = ctx->saved_data["temperature"].toDouble();
    auto grad = run_backward(saved[0], saved[1], temperature, grads[0], grads[1], saved[2], saved[3]);
    return {grad, at::Tensor(), at::Tensor()};
  }
};

TokenScores kernel_scores(const at::Tensor& logits, const at::Tensor& labels, double temperature) {
  detail::require_kernel_device(logits, "log_probs_and_entropy");
  const int64_t vocab = logits.size(-1);
  auto flat = logits.reshape({-1, vocab}).contiguous();
  auto flat_labels = labels.reshape({-1}).to(at::kLong).contiguous();
  if (flat_labels.device() != flat.device()) flat_labels = flat_labels.to(flat.device());
  if (!flat.is_cuda() && flat_labels.numel() > 0) {
    const auto bad = ((flat_labels < 0) | (flat_labels >= vocab)).nonzero();
    if (bad.numel() > 0) {
      const int64_t i = bad[0][0].item<int64_t>();
      throw ValueError("log_probs_and_entropy: label " + std::to_string(flat_labels[i].item<int64_t>()) +
                       " at flat position " + std::to_string(i) + " is outside the vocabulary [0, " +
                       std::to_string(vocab) + ")");
    }
  }
  auto out = FusedScores::apply(flat, flat_labels, temperature);
  const auto shape = logits.sizes().slice(0, logits.dim() - 1);
  return {out[0].reshape(shape), out[1].reshape(shape)};
}

void check_temperature(double t) {
  if (!(t > 0.0)) throw ValueError("log_probs_and_entropy: temperature must be > 0, got " + std::to_string(t));
}

}  // namespace

at::Tensor log_probs_from_logits(const at::Tensor& logits, const at::Tensor& labels, int64_t chunk_rows) {
  check_chunk(chunk_rows, "log_probs_from_logits");
  check_labels_shape(logits, labels, "log_probs_from_logits");
  if (uses_kernels(Impl::by_device, logits.device()) && detail::is_kernel_dtype(logits)) {
    return kernel_scores(logits, labels, 1.0).log_probs;
  }
  return reference_log_probs(logits, labels, chunk_rows, 1.0);
}

at::Tensor entropy_from_logits(const at::Tensor& logits) {
  if (logits.dim() < 1) throw ShapeError("entropy_from_logits: logits must have a vocab dim");
  if (uses_kernels(Impl::by_device, logits.device()) && detail::is_kernel_dtype(logits)) {
    auto labels = at::zeros(logits.sizes().slice(0, logits.dim() - 1), logits.options().dtype(at::kLong));
    return kernel_scores(logits, labels, 1.0).entropy;
  }
  return entropy_rows(logits.to(at::kFloat));
}

at::Tensor entropy_from_logits_chunked(const at::Tensor& logits, int64_t chunk_rows) {
  check_chunk(chunk_rows, "entropy_from_logits_chunked");
  if (logits.dim() < 1) throw ShapeError("entropy_from_logits_chunked: logits must have a vocab dim");
  if (uses_kernels(Impl::by_device, logits.device()) && detail::is_kernel_dtype(logits))
    return entropy_from_logits(logits);
  return reference_entropy(logits, chunk_rows, 1.0);
}

TokenScores log_probs_and_entropy(const at::Tensor& logits, const at::Tensor& labels, const ScoresOptions& options) {
  check_labels_shape(logits, labels, "log_probs_and_entropy");
  check_temperature(options.temperature);
  check_chunk(options.chunk_rows, "log_probs_and_entropy");
  const bool kernel = uses_kernels(options.impl, logits.device());
  if (kernel && !detail::is_kernel_dtype(logits)) {
    if (options.impl == Impl::kernel) {
      throw ValueError("log_probs_and_entropy: the kernel takes float32, bfloat16 or float16 logits, got " +
                       std::string(c10::toString(logits.scalar_type())));
    }
  } else if (kernel) {
    auto out = kernel_scores(logits, labels, options.temperature);
    if (!options.with_entropy) out.entropy = at::Tensor();
    return out;
  }
  TokenScores out;
  out.log_probs = reference_log_probs(logits, labels, options.chunk_rows, options.temperature);
  if (options.with_entropy) out.entropy = reference_entropy(logits, options.chunk_rows, options.temperature);
  return out;
}

}  // namespace hyflow::cuda
