// The token kernels against the equivalent ATen ops, one JSON line per figure (bench/README.md).
//   CPU:  the host build of the kernels (Impl::kernel) against the ATen reference (what CPU
//         tensors use): fused log-probs + entropy, and seeded sampling with top-p.
//   GPU:  the CUDA kernels against PyTorch's ops on the same device (log_softmax + gather,
//         entropy, softmax + sort-based top-p + multinomial), when this build has them
//         (-DHYFLOW_CUDA=ON with a CUDA LibTorch) and a device is visible; otherwise one line
//         saying the GPU figures were skipped and why.
// Each line also gives the bytes a kernel must move at least (one read of the logits plus its
// per-row inputs and outputs), the bandwidth that makes (bytes / best time) and, on a GPU, that
// against the device's HBM roofline (kernels::device::memory_bandwidth); on the host the
// roofline is null with the reason. The sampling kernel reads the logits more than once (one
// pass per radix digit of the top-k and top-p thresholds), so its figure is a lower bound of
// what it moves: the gap to the roofline is what fewer passes would win.
// Usage: cuda_kernels_bench [--quick]

#include "bench_json.hpp"

#include <hyflow/cuda/kernels.hpp>
#include <hyflow/cuda/log_probs.hpp>
#include <hyflow/cuda/sampling.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <string>

using namespace hyflow::cuda;

namespace {

/// What a kernel must move at least, and how close its best time comes to moving it at `roofline`
/// bytes/s (0: no device roofline, `why_not` says why). Added to the bench's JSON line.
struct Traffic {
  double bytes = 0;
  double roofline = 0;
  std::string why_not;
};

void emit(const std::string& bench, const std::string& c, double value, const std::string& peer, double peer_value,
          double ratio, const Traffic& t, double seconds) {
  nlohmann::json line{{"bench", bench},
                      {"case", c},
                      {"value", value},
                      {"unit", "rows/s"},
                      {"peer", peer},
                      {"peer_value", peer_value},
                      {"ratio", ratio},
                      {"min_bytes", t.bytes},
                      {"gb_s", t.bytes / seconds / 1e9}};
  if (t.roofline > 0) {
    line["roofline_gb_s"] = t.roofline / 1e9;
    line["roofline_fraction"] = t.bytes / seconds / t.roofline;
  } else {
    line["roofline_gb_s"] = nullptr;
    line["roofline_reason"] = t.why_not;
  }
  std::cout << line.dump() << std::endl;
}

/// Best of `reps` wall-clock seconds of fn (after one warm-up), synchronizing CUDA when asked.
double best_seconds(int reps, bool cuda, const std::function<void()>& fn) {
  fn();
  if (cuda) torch::cuda::synchronize();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    if (cuda) torch::cuda::synchronize();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Entropy as PyTorch users write it (verl's entropy_from_logits).
at::Tensor torch_entropy(const at::Tensor& logits) {
  auto p = logits.softmax(-1);
  return logits.logsumexp(-1) - (p * logits).sum(-1);
}

// Nucleus sampling as PyTorch users write it: sort, cumulative mass, mask, multinomial.
at::Tensor torch_top_p_sample(const at::Tensor& logits, double top_p) {
  auto [sorted, order] = logits.sort(-1, true);
  auto probs = sorted.softmax(-1);
  auto drop = (probs.cumsum(-1) - probs) >= top_p;
  auto masked = sorted.masked_fill(drop, -INFINITY).softmax(-1);
  return order.gather(-1, at::multinomial(masked, 1));
}

void bench_scores(const std::string& where, const at::Tensor& logits, const at::Tensor& labels, int reps,
                  const std::string& peer, const std::function<void()>& peer_fn, Impl impl, Traffic traffic) {
  const bool cuda = logits.is_cuda();
  const double ours = best_seconds(reps, cuda, [&] {
    auto s = log_probs_and_entropy(logits, labels, {.impl = impl});
    (void)s;
  });
  const double theirs = best_seconds(reps, cuda, peer_fn);
  const double rows = static_cast<double>(logits.size(0));
  const std::string c = where + " log-probs + entropy, " + std::to_string(logits.size(0)) + " x " +
                        std::to_string(logits.size(1)) + " " + c10::toString(logits.scalar_type());
  // one read of the logits; per row: the label in, log-prob, entropy, logsumexp and mean out
  traffic.bytes = static_cast<double>(logits.numel() * logits.element_size()) + rows * (8 + 4 * 4);
  emit("cuda_token_scores", c, rows / ours, peer, rows / theirs, theirs / ours, traffic, ours);
}

void bench_sampling(const std::string& where, const at::Tensor& logits, int reps, const std::string& peer,
                    const std::function<void()>& peer_fn, Impl impl, Traffic traffic) {
  const bool cuda = logits.is_cuda();
  uint64_t step = 0;
  const double ours = best_seconds(reps, cuda, [&] {
    auto t = sample_seeded(logits, {.top_p = 0.9}, 1, step++, {}, {}, impl);
    (void)t;
  });
  const double theirs = best_seconds(reps, cuda, peer_fn);
  const double rows = static_cast<double>(logits.size(0));
  const std::string c =
      where + " sampling top-p 0.9, " + std::to_string(logits.size(0)) + " x " + std::to_string(logits.size(1));
  // at least one read of the logits and the per-row settings (four floats or int64s) and the token
  traffic.bytes = static_cast<double>(logits.numel() * logits.element_size()) + rows * (4 * 8 + 8);
  emit("cuda_sampling", c, rows / ours, peer, rows / theirs, theirs / ours, traffic, ours);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  torch::manual_seed(0);
  // CPU: the host build against the ATen reference, one thread each.
  at::set_num_threads(1);
  const Traffic host{.why_not = "the host build: one CPU thread, no HBM roofline"};
  {
    const int64_t rows = quick ? 8 : 64, vocab = 32000;
    auto logits = torch::randn({rows, vocab}) * 3;
    auto labels = torch::randint(vocab, {rows});
    bench_scores(
        "cpu host-build kernel", logits, labels, quick ? 2 : 5, "aten reference (log_softmax, entropy)",
        [&] {
          auto s = log_probs_and_entropy(logits, labels, {.impl = Impl::reference});
          (void)s;
        },
        Impl::kernel, host);
    auto few = logits.narrow(0, 0, quick ? 4 : 16);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
    bench_sampling(
        "cpu host-build kernel", few, quick ? 2 : 5, "aten sort-based top-p + multinomial (cuda::sample)",
        [&] {
          auto t = sample(few, {.top_p = 0.9}, generator);
          (void)t;
        },
        Impl::kernel, host);
  }
  // GPU: the CUDA kernels against PyTorch's ops on the same device.
  if (!device_kernels_built() || !torch::cuda::is_available()) {
    const std::string why =
        !device_kernels_built()
            ? "this build has no CUDA kernels for tensors (needs -DHYFLOW_CUDA=ON and a CUDA LibTorch)"
            : "no CUDA device visible";
    std::cout << nlohmann::json{{"bench", "cuda_kernels_gpu"}, {"skipped", why}}.dump() << std::endl;
    std::cout << nlohmann::json{{"bench", "cuda_kernels_roofline"}, {"hbm_gb_s", nullptr}, {"reason", why}}.dump()
              << std::endl;
    return 0;
  }
  const int64_t rows = quick ? 256 : 2048, vocab = 151936;  // Qwen2's vocabulary
  const Traffic device{.roofline = kernels::device::memory_bandwidth(0)};
  std::cout << nlohmann::json{{"bench", "cuda_kernels_roofline"}, {"hbm_gb_s", device.roofline / 1e9}}.dump()
            << std::endl;
  for (auto dtype : {at::kBFloat16, at::kFloat}) {
    auto logits = (torch::randn({rows, vocab}, torch::kCUDA) * 3).to(dtype);
    auto labels = torch::randint(vocab, {rows}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong));
    bench_scores(
        "cuda kernel", logits, labels, quick ? 3 : 10, "pytorch ops (log_softmax+gather, entropy)",
        [&] {
          auto z = logits.to(at::kFloat);
          auto lp = z.log_softmax(-1).gather(-1, labels.unsqueeze(-1));
          auto e = torch_entropy(z);
          (void)lp, (void)e;
        },
        Impl::by_device, device);
  }
  auto logits = torch::randn({quick ? 64 : 256, vocab}, torch::kCUDA) * 3;
  bench_sampling(
      "cuda kernel", logits, quick ? 3 : 10, "pytorch ops (sort, cumsum, multinomial)",
      [&] {
        auto t = torch_top_p_sample(logits, 0.9);
        (void)t;
      },
      Impl::by_device, device);
  return 0;
}
