// The tensor adapter on a GPU as the decode engine calls it: bf16 logits at Qwen2's vocabulary
// (151,936), per-row device arrays (temperature, top-k, top-p, min-p, step), row ids, on a
// non-default stream. Built only against a CUDA LibTorch; without a device it prints why and
// exits 77 (CTest: "Not Run (Skipped)").
#include <hyflow/core/torch_compat.hpp>
#include <hyflow/cuda/kernels.hpp>
#include <hyflow/cuda/log_probs.hpp>
#include <hyflow/cuda/sampling.hpp>

#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

using namespace hyflow::cuda;

TEST_CASE("per-row device arrays on a side stream at vocab 151,936 in bf16: the reference's tokens and scores") {
  const int64_t rows = 24, vocab = 151936;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto cpu_logits = (torch::randn({rows, vocab}, gen) * 3).to(at::kBFloat16);
  std::vector<float> temperature, top_p, min_p;
  std::vector<int64_t> top_k, step, row_ids;
  for (int64_t r = 0; r < rows; ++r) {
    temperature.push_back(std::vector<float>{0.0f, 0.7f, 1.0f, 1.3f}[r % 4]);
    top_k.push_back(std::vector<int64_t>{-1, 50, 1000, 0, 20}[r % 5]);
    top_p.push_back(std::vector<float>{1.0f, 0.9f, 0.7f}[r % 3]);
    min_p.push_back(r % 2 == 0 ? 0.0f : 0.05f);
    step.push_back(3 * r + 1);
    row_ids.push_back(100 + r);
  }
  RowSampling host_rows{torch::tensor(temperature), torch::tensor(top_k), torch::tensor(top_p), torch::tensor(min_p),
                        torch::tensor(step)};
  const auto host_ids = torch::tensor(row_ids);
  const SamplingOptions options;
  const uint64_t seed = 2024;

  const auto side = hyflow::torch_compat::side_stream(0);
  at::Tensor tokens, log_probs, entropy;
  {
    // Everything on the side stream, a non-blocking stream of LibTorch's pool: the logits are
    // computed there just before the kernels read them, so a kernel launched on another stream
    // would race with that computation.
    c10::cuda::CUDAStreamGuard guard(side);
    const at::Device cuda(at::kCUDA, 0);
    auto logits = (cpu_logits.to(cuda).to(at::kFloat) * 1.0f).to(at::kBFloat16);
    RowSampling device_rows{host_rows.temperature.to(cuda), host_rows.top_k.to(cuda), host_rows.top_p.to(cuda),
                            host_rows.min_p.to(cuda), host_rows.step.to(cuda)};
    auto device_tokens = sample_seeded_unchecked(logits, options, seed, 0, host_ids.to(cuda), device_rows);
    auto scores = log_probs_and_entropy(logits, device_tokens.clamp_min(0));
    tokens = device_tokens.cpu();  // copies on the side stream and waits for it
    log_probs = scores.log_probs.cpu();
    entropy = scores.entropy.cpu();
  }
  const auto want = sample_seeded(cpu_logits, options, seed, 0, host_ids, host_rows, Impl::reference);
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) mismatches += tokens[r].item<int64_t>() != want[r].item<int64_t>();
  CHECK(mismatches <= 1);  // only a race within the libm error could differ
  CHECK((tokens >= 0).all().item<bool>());
  const auto reference = log_probs_and_entropy(cpu_logits, tokens, {.impl = Impl::reference});
  CHECK(torch::allclose(log_probs, reference.log_probs, 1e-3, 2e-3));
  CHECK(torch::allclose(entropy, reference.entropy, 1e-3, 2e-3));
}

int main(int argc, char* argv[]) {
  if (!hyflow::cuda::kernels::device::available()) {  // throws on a CUDA error other than "no device"
    std::cout << "SKIPPED: no CUDA device visible; the adapter device test was built but not run\n";
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
