#include <hyflow/cuda/sampling.hpp>

#include "kernels/common.cuh"
#include "torch_device.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/core/torch_compat.hpp>
#include <hyflow/cuda/kernels.hpp>

#include <limits>
#include <string>

namespace hyflow::cuda {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

void check_logits(const at::Tensor& logits) {
  if (logits.dim() != 2) {
    throw ShapeError("sampling: logits must be (B, V), got " + std::to_string(logits.dim()) + "-D");
  }
  if (!at::isFloatingType(logits.scalar_type())) {
    throw ValueError("sampling: logits must be floating point");
  }
}

/// Per-row settings resolved to tensors on the logits' device: (B,) each.
struct Resolved {
  at::Tensor temperature;  // float
  at::Tensor top_k;        // int64
  at::Tensor top_p;        // float
  at::Tensor min_p;        // float
};

// The first row where `bad` (B,) bool is true, or -1.
int64_t first_true(const at::Tensor& bad) {
  auto idx = bad.nonzero();
  return idx.numel() == 0 ? -1 : idx[0][0].item<int64_t>();
}

at::Tensor per_row(const at::Tensor& given, int64_t rows, double scalar, at::ScalarType type, const at::Tensor& logits,
                   const char* field) {
  if (!given.defined()) return at::full({rows}, scalar, logits.options().dtype(type));
  if (given.dim() != 1 || given.size(0) != rows) {
    throw ShapeError(std::string("sampling: per-row ") + field + " must be (" + std::to_string(rows) + ",), got " +
                     std::to_string(given.dim()) + "-D with " + std::to_string(given.numel()) + " elements");
  }
  return given.to(logits.device(), type).contiguous();
}

Resolved resolve(const at::Tensor& logits, const SamplingOptions& o, const RowSampling& r) {
  const int64_t rows = logits.size(0);
  const double temperature = o.is_greedy() ? 0.0 : o.temperature;
  Resolved out{per_row(r.temperature, rows, temperature, at::kFloat, logits, "temperature"),
               per_row(r.top_k, rows, static_cast<double>(o.top_k), at::kLong, logits, "top_k"),
               per_row(r.top_p, rows, o.top_p, at::kFloat, logits, "top_p"),
               per_row(r.min_p, rows, o.min_p, at::kFloat, logits, "min_p")};
  auto fail = [](const char* field, const at::Tensor& values, int64_t row, const char* range) {
    throw ValueError(std::string("sampling: ") + field + " of row " + std::to_string(row) + " must be " + range +
                     ", got " + std::to_string(values[row].item<double>()));
  };
  if (r.temperature.defined()) {
    if (int64_t row = first_true(~(out.temperature >= 0)); row >= 0) fail("temperature", out.temperature, row, ">= 0");
  }
  if (r.top_p.defined()) {
    if (int64_t row = first_true(~((out.top_p > 0) & (out.top_p <= 1))); row >= 0)
      fail("top_p", out.top_p, row, "in (0, 1]");
  }
  if (r.min_p.defined()) {
    if (int64_t row = first_true(~((out.min_p >= 0) & (out.min_p <= 1))); row >= 0)
      fail("min_p", out.min_p, row, "in [0, 1]");
  }
  return out;
}

// --- the reference filters, per row ----------------------------------------------------------

// Keeps the logits >= the k-th largest of each row (ties with it are kept).
at::Tensor apply_top_k(const at::Tensor& z, const at::Tensor& top_k) {
  const int64_t vocab = z.size(-1);
  auto k = at::where((top_k <= 0) | (top_k >= vocab), at::full_like(top_k, vocab), top_k);
  if ((k < vocab).any().item<bool>() == false) return z;
  auto sorted = std::get<0>(z.sort(-1, /*descending=*/true));
  auto kth = sorted.gather(-1, (k - 1).unsqueeze(-1));  // (B, 1)
  return z.masked_fill(z < kth, kMinusInf);
}

// Keeps a token while the mass of the strictly more likely tokens is below p (at least one).
at::Tensor apply_top_p(const at::Tensor& z, const at::Tensor& top_p) {
  auto active = top_p < 1;
  if (!active.any().item<bool>()) return z;
  auto [sorted, order] = z.sort(-1, /*descending=*/true);
  auto probs = sorted.softmax(-1);
  auto before = probs.cumsum(-1) - probs;  // mass strictly before each position
  // Tied tokens share the mass before the first of them: carry each tie group's first value.
  auto starts = at::ones_like(sorted, sorted.options().dtype(at::kBool));
  if (sorted.size(-1) > 1) {
    starts.narrow(-1, 1, sorted.size(-1) - 1)
        .copy_(sorted.narrow(-1, 1, sorted.size(-1) - 1) != sorted.narrow(-1, 0, sorted.size(-1) - 1));
  }
  auto before_group = std::get<0>(at::where(starts, before, at::full_like(before, -1.0)).cummax(-1));
  auto drop_sorted = (before_group >= top_p.unsqueeze(-1)) & active.unsqueeze(-1);
  drop_sorted.select(-1, 0).fill_(false);
  auto drop = at::empty_like(drop_sorted).scatter_(-1, order, drop_sorted);
  return z.masked_fill(drop, kMinusInf);
}

// Drops tokens whose probability is below min_p times the row's largest probability.
at::Tensor apply_min_p(const at::Tensor& z, const at::Tensor& min_p) {
  if (!(min_p > 0).any().item<bool>()) return z;
  auto probs = z.softmax(-1);
  auto threshold = std::get<0>(probs.max(-1, /*keepdim=*/true)) * min_p.unsqueeze(-1);
  return z.masked_fill(probs < threshold, kMinusInf);
}

at::Tensor filter_resolved(const at::Tensor& logits, const Resolved& r) {
  auto raw = logits.to(at::kFloat);
  auto greedy = ~(r.temperature > 0);
  auto inv_t = at::where(greedy, at::ones_like(r.temperature), r.temperature.reciprocal());
  auto z = raw * inv_t.unsqueeze(-1);
  z = apply_top_k(z, r.top_k);
  z = apply_top_p(z, r.top_p);
  z = apply_min_p(z, r.min_p);
  return at::where(greedy.unsqueeze(-1), raw, z);
}

// --- seeded sampling -------------------------------------------------------------------------

void throw_invalid_rows(const at::Tensor& tokens) {
  if (int64_t row = first_true(tokens < 0); row >= 0) {
    throw ValueError("sample_seeded: row " + std::to_string(row) + " has a NaN logit or no finite logit");
  }
}

// The reference: ATen filters, then the exponential race with the kernels' Philox noise.
at::Tensor reference_seeded(const at::Tensor& logits, const Resolved& r, uint64_t seed, uint64_t step,
                            const at::Tensor& row_ids, const at::Tensor& steps) {
  namespace kd = kernels::detail;
  auto raw = logits.to(at::kCPU, at::kFloat).contiguous();
  auto z =
      filter_resolved(raw, Resolved{r.temperature.cpu(), r.top_k.cpu(), r.top_p.cpu(), r.min_p.cpu()}).contiguous();
  auto temperature_tensor = r.temperature.cpu();
  auto temperature = temperature_tensor.accessor<float, 1>();
  auto ids = row_ids.defined() ? row_ids.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  auto row_steps = steps.defined() ? steps.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  const int64_t rows = raw.size(0), vocab = raw.size(1);
  auto tokens = at::empty({rows}, at::kLong);
  auto tok = tokens.accessor<int64_t, 1>();
  for (int64_t b = 0; b < rows; ++b) {
    const float* x = raw.data_ptr<float>() + b * vocab;
    const float* zr = z.data_ptr<float>() + b * vocab;
    // invalid rows: a NaN, or a max that is not finite
    bool nan = false;
    float max = kMinusInf;
    int64_t arg = -1;
    for (int64_t j = 0; j < vocab; ++j) {
      if (x[j] != x[j]) nan = true;
      if (arg < 0 || x[j] > max) max = x[j], arg = j;
    }
    if (nan || !(max > kMinusInf) || max == std::numeric_limits<float>::infinity()) {
      tok[b] = -1;
      continue;
    }
    if (!(temperature[b] > 0)) {
      tok[b] = arg;
      continue;
    }
    const uint64_t row_id =
        ids.defined() ? static_cast<uint64_t>(ids.data_ptr<int64_t>()[b]) : static_cast<uint64_t>(b);
    const uint64_t row_step = row_steps.defined() ? static_cast<uint64_t>(row_steps.data_ptr<int64_t>()[b]) : step;
    float best = kMinusInf;
    int64_t chosen = -1;
    for (int64_t j = 0; j < vocab; ++j) {
      if (zr[j] == kMinusInf) continue;
      const auto bits = kd::token_randoms(seed, row_id, row_step, static_cast<uint64_t>(j / 4)).v[j % 4];
      const float key = kd::race_key(zr[j], bits);
      if (chosen < 0 || key > best) best = key, chosen = j;
    }
    tok[b] = chosen;
  }
  return tokens.to(logits.device());
}

at::Tensor kernel_seeded(const at::Tensor& logits, const Resolved& r, uint64_t seed, uint64_t step,
                         const at::Tensor& row_ids, const at::Tensor& steps) {
  const auto x = (detail::is_kernel_dtype(logits) ? logits : logits.to(at::kFloat)).contiguous();
  at::Tensor ids;
  auto tokens = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  auto a = detail::logits_args<kernels::SampleArgs>(x);
  a.temperature = r.temperature.data_ptr<float>();
  a.top_k = r.top_k.data_ptr<int64_t>();
  a.top_p = r.top_p.data_ptr<float>();
  a.min_p = r.min_p.data_ptr<float>();
  if (row_ids.defined()) {
    ids = row_ids.to(x.device(), at::kLong).contiguous();
    a.row_ids = ids.data_ptr<int64_t>();
  }
  a.seed = seed;
  a.step = step;
  at::Tensor row_steps;
  if (steps.defined()) {
    row_steps = steps.to(x.device(), at::kLong).contiguous();
    a.steps = row_steps.data_ptr<int64_t>();
  }
  a.tokens = tokens.data_ptr<int64_t>();
  detail::launch(x, "sample_seeded", a, kernels::host::sample, kernels::device::sample);
  return tokens;
}

}  // namespace

void validate(const SamplingOptions& o) {
  if (!(o.temperature >= 0.0)) {
    throw ValueError("sampling: temperature must be >= 0, got " + std::to_string(o.temperature));
  }
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) {
    throw ValueError("sampling: top_p must be in (0, 1], got " + std::to_string(o.top_p));
  }
  if (!(o.min_p >= 0.0 && o.min_p <= 1.0)) {
    throw ValueError("sampling: min_p must be in [0, 1], got " + std::to_string(o.min_p));
  }
}

at::Tensor filter_logits(const at::Tensor& logits, const SamplingOptions& options) {
  check_logits(logits);
  validate(options);
  if (options.is_greedy()) return logits;
  return filter_resolved(logits, resolve(logits, options, {}));
}

at::Tensor filter_logits_rows(const at::Tensor& logits, const SamplingOptions& options, const RowSampling& rows) {
  check_logits(logits);
  validate(options);
  return filter_resolved(logits, resolve(logits, options, rows));
}

at::Tensor sample(const at::Tensor& logits, const SamplingOptions& options, std::optional<at::Generator> generator) {
  auto z = filter_logits(logits, options);
  if (options.is_greedy()) return z.argmax(-1);
  auto probs = z.softmax(-1);
  torch_compat::Optional<at::Generator> gen;
  if (generator) gen = *generator;
  return at::multinomial(probs, 1, /*replacement=*/false, gen).squeeze(-1);
}

at::Tensor sample_seeded_unchecked(const at::Tensor& logits, const SamplingOptions& options, uint64_t seed,
                                   uint64_t step, const at::Tensor& row_ids, const RowSampling& rows, Impl impl) {
  check_logits(logits);
  validate(options);
  const int64_t n = logits.size(0);
  if (row_ids.defined() && (row_ids.dim() != 1 || row_ids.size(0) != n)) {
    throw ShapeError("sample_seeded: row_ids must be (" + std::to_string(n) + ",), got " +
                     std::to_string(row_ids.numel()) + " elements");
  }
  if (rows.step.defined() && (rows.step.dim() != 1 || rows.step.size(0) != n)) {
    throw ShapeError("sample_seeded: per-row step must be (" + std::to_string(n) + ",), got " +
                     std::to_string(rows.step.numel()) + " elements");
  }
  if (uses_kernels(impl, logits.device())) {
    detail::require_kernel_device(logits, "sample_seeded");
  } else if (!logits.device().is_cpu()) {
    // The reference draws in a host loop: it would copy these logits to the host every step.
    throw ValueError("sample_seeded: logits on " + logits.device().str() +
                     " would be copied to the host by the reference sampler every step: " +
                     (impl == Impl::reference ? std::string("Impl::reference takes CPU logits")
                                              : std::string("this build has no CUDA kernels for tensors (configure "
                                                            "-DHYFLOW_CUDA=ON against a LibTorch with CUDA, "
                                                            "docs/gpu.md)")));
  }
  const auto resolved = resolve(logits, options, rows);
  return uses_kernels(impl, logits.device()) ? kernel_seeded(logits, resolved, seed, step, row_ids, rows.step)
                                             : reference_seeded(logits, resolved, seed, step, row_ids, rows.step);
}

at::Tensor sample_seeded(const at::Tensor& logits, const SamplingOptions& options, uint64_t seed, uint64_t step,
                         const at::Tensor& row_ids, const RowSampling& rows, Impl impl) {
  auto tokens = sample_seeded_unchecked(logits, options, seed, step, row_ids, rows, impl);
  throw_invalid_rows(tokens);
  return tokens;
}

}  // namespace hyflow::cuda
