// The tensor adapter of the token kernels (log_probs.hpp, sampling.hpp): dispatch, autograd and
// errors, on CPU tensors with the host build of the kernels (Impl::kernel) against the reference.

#include <hyflow/core/error.hpp>
#include <hyflow/cuda/log_probs.hpp>
#include <hyflow/cuda/sampling.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

using namespace hyflow::cuda;

namespace {
at::Generator seeded(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}
}  // namespace

TEST_CASE("CPU tensors use the reference unless the kernel is asked for") {
  CHECK_FALSE(uses_kernels(Impl::by_device, at::Device(at::kCPU)));
  CHECK(uses_kernels(Impl::kernel, at::Device(at::kCPU)));
  CHECK_FALSE(uses_kernels(Impl::reference, at::Device(at::kCPU)));
}

TEST_CASE("a tensor the kernels cannot read is an error naming the op, never a silent host copy") {
  // A CPU LibTorch has no CUDA tensors; a meta tensor stands for any tensor off the host that
  // this build has no kernels for (a CUDA tensor when HYFLOW_TORCH_CUDA is 0).
  auto logits = at::zeros({2, 16}, at::TensorOptions().device(at::kMeta));
  auto labels = at::zeros({2}, at::TensorOptions().device(at::kMeta).dtype(at::kLong));
  SamplingOptions o;
  auto by_device = [&] { return sample_seeded(logits, o, 1, 0); };
  auto reference = [&] { return sample_seeded_unchecked(logits, o, 1, 0, {}, {}, Impl::reference); };
  auto kernel = [&] { return sample_seeded(logits, o, 1, 0, {}, {}, Impl::kernel); };
  auto scores = [&] { return log_probs_and_entropy(logits, labels, {.impl = Impl::kernel}); };
  CHECK_THROWS_AS(by_device(), hyflow::ValueError);
  CHECK_THROWS_WITH(by_device(), Catch::Contains("sample_seeded: logits on meta would be copied to the host"));
  CHECK_THROWS_AS(reference(), hyflow::ValueError);
  CHECK_THROWS_WITH(reference(), Catch::Contains("Impl::reference takes CPU logits"));
  CHECK_THROWS_AS(kernel(), hyflow::ValueError);
  CHECK_THROWS_WITH(kernel(), Catch::Contains("sample_seeded: a tensor on meta cannot run the token kernels"));
  CHECK_THROWS_AS(scores(), hyflow::ValueError);
  CHECK_THROWS_WITH(scores(), Catch::Contains("log_probs_and_entropy: a tensor on meta cannot run the token kernels"));
}

TEST_CASE("log_probs_and_entropy: kernel and reference agree on values and gradients") {
  auto base = torch::randn({2, 3, 1030}, seeded(1)) * 3;
  auto labels = torch::randint(1030, {2, 3}, seeded(2));
  for (double temperature : {1.0, 0.8}) {
    auto a = base.clone().requires_grad_(), b = base.clone().requires_grad_();
    auto k = log_probs_and_entropy(a, labels, {.temperature = temperature, .impl = Impl::kernel});
    auto r = log_probs_and_entropy(b, labels, {.temperature = temperature, .impl = Impl::reference});
    REQUIRE(k.log_probs.sizes() == labels.sizes());
    CHECK(torch::allclose(k.log_probs, r.log_probs, 1e-4, 1e-5));
    CHECK(torch::allclose(k.entropy, r.entropy, 1e-4, 1e-5));
    auto w = torch::randn({2, 3}, seeded(3));
    ((k.log_probs * w).sum() + (k.entropy * w * 0.5).sum()).backward();
    ((r.log_probs * w).sum() + (r.entropy * w * 0.5).sum()).backward();
    CHECK(torch::allclose(a.grad(), b.grad(), 1e-4, 1e-6));
  }
}

TEST_CASE("log_probs_and_entropy: only the log-probs used still back-propagates") {
  auto logits = torch::randn({4, 50}, seeded(4)).requires_grad_();
  auto labels = torch::randint(50, {4}, seeded(5));
  auto out = log_probs_and_entropy(logits, labels, {.with_entropy = false, .impl = Impl::kernel});
  CHECK_FALSE(out.entropy.defined());
  out.log_probs.sum().backward();
  auto onehot = torch::one_hot(labels, 50).to(at::kFloat);
  CHECK(torch::allclose(logits.grad(), onehot - logits.detach().softmax(-1), 1e-5, 1e-6));
}

TEST_CASE("log_probs_and_entropy: bf16 logits get a bf16 gradient") {
  auto logits = torch::randn({3, 40}, seeded(6)).to(at::kBFloat16).requires_grad_();
  auto labels = torch::randint(40, {3}, seeded(7));
  auto out = log_probs_and_entropy(logits, labels, {.impl = Impl::kernel});
  CHECK(out.log_probs.scalar_type() == at::kFloat);
  out.log_probs.sum().backward();
  CHECK(logits.grad().scalar_type() == at::kBFloat16);
}

TEST_CASE("log_probs_and_entropy: bad labels, temperature and dtype are named") {
  auto logits = torch::zeros({2, 5});
  CHECK_THROWS_WITH(log_probs_and_entropy(logits, torch::tensor({1, 5}), {.impl = Impl::kernel}),
                    Catch::Contains("label 5") && Catch::Contains("[0, 5)"));
  CHECK_THROWS_WITH(log_probs_and_entropy(logits, torch::tensor({1, 2}), {.temperature = 0}),
                    Catch::Contains("temperature"));
  CHECK_THROWS_WITH(log_probs_and_entropy(logits.to(at::kDouble), torch::tensor({1, 2}), {.impl = Impl::kernel}),
                    Catch::Contains("Double"));
  CHECK_THROWS_AS(log_probs_and_entropy(logits, torch::tensor({1, 2, 3})), hyflow::ShapeError);
}

TEST_CASE("entropy with -inf logits counts them as probability 0") {
  auto logits = torch::tensor({{0.f, 0.f, -INFINITY, -INFINITY}});
  CHECK(entropy_from_logits(logits).item<float>() == Approx(std::log(2.0)));
  CHECK(entropy_from_logits_chunked(logits, 1).item<float>() == Approx(std::log(2.0)));
}

TEST_CASE("sample_seeded: the kernel and the reference draw the same tokens") {
  auto logits = torch::randn({32, 900}, seeded(8)) * 2;
  SamplingOptions o{.temperature = 0.9, .top_k = 100, .top_p = 0.9, .min_p = 0.01};
  auto k = sample_seeded(logits, o, 42, 3, {}, {}, Impl::kernel);
  auto r = sample_seeded(logits, o, 42, 3, {}, {}, Impl::reference);
  CHECK((k != r).sum().item<int64_t>() <= 1);
  CHECK(torch::equal(sample_seeded(logits, o, 42, 3), r));  // CPU tensors: the reference
  CHECK_FALSE(torch::equal(sample_seeded(logits, o, 42, 4), r));
}

TEST_CASE("sample_seeded: per-row settings, greedy rows among sampled ones") {
  auto logits = torch::randn({4, 64}, seeded(9));
  RowSampling rows{.temperature = torch::tensor({0.f, 1.f, 0.f, 0.5f}), .top_k = torch::tensor({-1, 1, 5, 3})};
  for (Impl impl : {Impl::kernel, Impl::reference}) {
    auto tokens = sample_seeded(logits, {}, 1, 0, {}, rows, impl);
    auto argmax = logits.argmax(-1);
    CHECK(tokens[0].item<int64_t>() == argmax[0].item<int64_t>());
    CHECK(tokens[1].item<int64_t>() == argmax[1].item<int64_t>());  // top-k 1
    CHECK(tokens[2].item<int64_t>() == argmax[2].item<int64_t>());
    auto top3 = std::get<1>(logits[3].topk(3));
    CHECK((top3 == tokens[3]).any().item<bool>());
  }
}

TEST_CASE("sample_seeded: a row without a finite logit and bad per-row settings are named") {
  auto logits = torch::zeros({3, 4});
  logits[1].fill_(-INFINITY);
  for (Impl impl : {Impl::kernel, Impl::reference}) {
    CHECK_THROWS_WITH(sample_seeded(logits, {}, 1, 0, {}, {}, impl), Catch::Contains("row 1"));
  }
  auto ok = torch::zeros({3, 4});
  CHECK_THROWS_WITH(sample_seeded(ok, {}, 1, 0, {}, {.top_p = torch::tensor({0.5f, 0.f, 1.f})}),
                    Catch::Contains("top_p of row 1"));
  CHECK_THROWS_WITH(sample_seeded(ok, {}, 1, 0, {}, {.min_p = torch::tensor({0.5f, 1.f})}),
                    Catch::Contains("min_p") && Catch::Contains("(3,)"));
  CHECK_THROWS_AS(sample_seeded(ok, {}, 1, 0, torch::tensor({1, 2})), hyflow::ShapeError);
}

TEST_CASE("sample_seeded: a per-row step draws each row as a call at that step would") {
  auto logits = torch::randn({6, 500}, seeded(31)) * 0.3;  // flat: different steps draw differently
  const auto ids = torch::tensor({40, 41, 42, 43, 44, 45}, torch::kLong);
  const auto steps = torch::tensor({3, 9, 3, 0, 9, 12}, torch::kLong);
  SamplingOptions o{.temperature = 1.1, .top_p = 0.9};
  for (Impl impl : {Impl::kernel, Impl::reference}) {
    auto mixed = sample_seeded(logits, o, 5, /*step=*/77, ids, {.step = steps}, impl);
    for (int64_t r = 0; r < 6; ++r) {
      auto alone = sample_seeded(logits.narrow(0, r, 1), o, 5, static_cast<uint64_t>(steps[r].item<int64_t>()),
                                 ids.narrow(0, r, 1), {}, impl);
      CHECK(mixed[r].item<int64_t>() == alone[0].item<int64_t>());
    }
    // the step argument applies to every row only without per-row steps
    CHECK_FALSE(torch::equal(mixed, sample_seeded(logits, o, 5, 3, ids, {}, impl)));
  }
  CHECK_THROWS_AS(sample_seeded(logits, o, 5, 0, ids, {.step = torch::tensor({1, 2})}), hyflow::ShapeError);
}

TEST_CASE("sample_seeded_unchecked: a row without a finite logit gets -1 instead of an error") {
  auto logits = torch::randn({3, 16}, seeded(32));
  for (Impl impl : {Impl::kernel, Impl::reference}) {
    logits[1].fill_(-INFINITY);
    auto tokens = sample_seeded_unchecked(logits, {}, 1, 0, {}, {}, impl);
    CHECK(tokens[1].item<int64_t>() == -1);
    CHECK(tokens[0].item<int64_t>() >= 0);
    CHECK(tokens[2].item<int64_t>() >= 0);
    logits[1].fill_(0.0);
    auto valid = sample_seeded_unchecked(logits, {}, 1, 0, {}, {}, impl);
    CHECK(torch::equal(valid.narrow(0, 0, 1), tokens.narrow(0, 0, 1)));  // row 0 does not depend on row 1
  }
}
