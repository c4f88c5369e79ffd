#include "rank_threads.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/core/net.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/parallel/fsdp_checkpoint.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include <unistd.h>

using namespace hyflow;
using namespace hyflow::parallel;

namespace {

// A residual tanh MLP whose parameter names follow a decoder LM's ("layers.<i>."), with row
// counts that do not divide by 2 or 4 (padding) and a head with fewer rows than ranks.
struct ToyImpl : torch::nn::Module {
  ToyImpl() {
    embed = register_module("embed", torch::nn::Linear(5, 6));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) layers->push_back(torch::nn::Linear(6, 6));
    head = register_module("head", torch::nn::Linear(6, 3));
  }
  at::Tensor forward(const at::Tensor& x, FsdpModule* fsdp) {
    if (fsdp) fsdp->begin_forward();
    auto h = torch::tanh(embed(x));
    for (int i = 0; i < 3; ++i) {
      if (fsdp) h = fsdp->enter_unit(i, h);
      h = h + torch::tanh(layers[i]->as<torch::nn::LinearImpl>()->forward(h));
      if (fsdp) h = fsdp->exit_unit(i, h);
    }
    return head(h);
  }
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(Toy);

// A small language model: an embedding with vocabulary rows that do not divide by 2 or 4, three
// residual layers, a root-unit scale after them (a final norm's place) and a head tied to the
// embedding or its own, computed through FsdpModule::head (or plainly, with `engine_head` false).
constexpr int64_t kVocab = 37, kDim = 6, kSeq = 5;
struct ToyLMImpl : torch::nn::Module {
  explicit ToyLMImpl(bool tied) {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kDim));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) layers->push_back(torch::nn::Linear(kDim, kDim));
    scale = register_parameter("scale", torch::linspace(0.5, 1.5, kDim));
    if (!tied)
      lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(kDim, kVocab).bias(false)));
  }
  const at::Tensor& head_weight() const { return lm_head ? lm_head->weight : embed->weight; }
  at::Tensor forward(const at::Tensor& ids, FsdpModule* fsdp, bool engine_head = true) {
    if (fsdp) fsdp->begin_forward();
    auto h = embed(ids);
    for (int i = 0; i < 3; ++i) {
      if (fsdp) h = fsdp->enter_unit(i, h);
      h = h + torch::tanh(layers[i]->as<torch::nn::LinearImpl>()->forward(h));
      if (fsdp) h = fsdp->exit_unit(i, h);
    }
    h = h * scale;
    auto logits = [this](const at::Tensor& x) { return torch::nn::functional::linear(x, head_weight()); };
    return fsdp && engine_head ? fsdp->head(h, head_weight(), logits) : logits(h);
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::nn::Linear lm_head{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(ToyLM);

using State = std::map<std::string, at::Tensor>;

State state_of(torch::nn::Module& model) {
  State state;
  for (const auto& item : model.named_parameters()) state[item.key()] = item.value().detach().clone();
  return state;
}

void load_state(torch::nn::Module& model, const State& state) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) item.value().copy_(state.at(item.key()));
}

std::vector<NamedParameter> named(torch::nn::Module& model) {
  std::vector<NamedParameter> out;
  for (const auto& item : model.named_parameters()) out.push_back({item.key(), item.value()});
  return out;
}

State initial_state() {
  torch::manual_seed(7);
  Toy model;
  return state_of(*model);
}

Toy toy_from(const State& state) {
  Toy model;
  load_state(*model, state);
  return model;
}

OptimConfig optim() {
  OptimConfig o;
  o.lr = 0.05;
  o.weight_decay = 0.01;
  return o;
}

constexpr int kSteps = 10;
constexpr int kRows = 8;
constexpr double kMaxNorm = 0.3;  // small enough that most steps clip

struct Data {
  at::Tensor x, y;
};
Data data() {
  auto x = torch::linspace(-1, 1, kRows * 5).view({kRows, 5});
  auto y = torch::sin(torch::arange(kRows * 3, torch::kFloat)).view({kRows, 3});
  return {x, y};
}

// A model under training: a fresh copy of the initial weights, and the loss (a mean over rows)
// of rows [begin, begin + count) of the global batch, sharded when `fsdp` is set.
struct Case {
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  std::function<at::Tensor(torch::nn::Module&, FsdpModule*, int64_t begin, int64_t count)> loss;
};

Case toy_case() {
  const auto state = initial_state();
  return {[state] { return toy_from(state).ptr(); },
          [](torch::nn::Module& model, FsdpModule* fsdp, int64_t begin, int64_t count) {
            auto [x, y] = data();
            return torch::mse_loss(static_cast<ToyImpl&>(model).forward(x.narrow(0, begin, count), fsdp),
                                   y.narrow(0, begin, count));
          }};
}

at::Tensor lm_tokens() {
  return torch::remainder(torch::arange(kRows * (kSeq + 1), torch::kLong) * 7 + 3, kVocab).view({kRows, kSeq + 1});
}

Case lm_case(bool tied, bool engine_head = true) {
  torch::manual_seed(11);
  const auto state = state_of(*ToyLM(tied));
  return {
      [state, tied] {
        ToyLM model(tied);
        load_state(*model, state);
        return model.ptr();
      },
      [engine_head](torch::nn::Module& model, FsdpModule* fsdp, int64_t begin, int64_t count) {
        auto ids = lm_tokens().narrow(0, begin, count);
        auto logits = static_cast<ToyLMImpl&>(model).forward(ids.narrow(1, 0, kSeq), fsdp, engine_head);
        // the loss in float32 whatever the compute dtype (as the workers' log-probs)
        return torch::nn::functional::cross_entropy(logits.to(at::kFloat).reshape({-1, kVocab}),
                                                    ids.narrow(1, 1, kSeq).reshape({-1}));
      }};
}

struct Trace {
  std::vector<double> losses, norms;
  std::map<std::string, at::Tensor> weights;
};

// One rank, the whole batch, the replicated optimizer: the reference.
Trace train_reference(const Case& c) {
  auto model = c.make();
  std::vector<at::Tensor> trainable;  // every parameter but frozen ones (requires_grad false)
  for (const auto& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  DataParallelOptimizer opt(trainable, optim(), nullptr, "optim");
  Trace t;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto loss = c.loss(*model, nullptr, 0, kRows);
    loss.backward();
    t.losses.push_back(loss.item<double>());
    t.norms.push_back(opt.step(kMaxNorm));
  }
  t.weights = state_of(*model);
  return t;
}

using test::run_ranks;

// n ranks, each with kRows / n rows in two micro-batches (gradient accumulation: only the last
// one synchronizes), the sharded optimizer.
// With `offload`, param_offload and optimizer_offload through the testing copies: the shards and
// the moments move to separate host copies between uses, as on a GPU.
// `precision`: fsdp_config.mixed_precision (the masters, their gradients and the moments are
// checked to stay float32).
std::vector<Trace> train_sharded(const Case& c, int n, int64_t fsdp_size, bool reshard_after_forward,
                                 ShardingStrategy expected, bool offload = false, MixedPrecision precision = {}) {
  std::vector<Trace> traces(static_cast<size_t>(n));
  test::RankChecks checks;
  run_ranks(n, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = c.make();
    auto fsdp = std::make_shared<FsdpModule>(units_by_layer(named(*model), 0), make_device_mesh(pg, fsdp_size),
                                             FsdpOptions{.reshard_after_forward = reshard_after_forward,
                                                         .mixed_precision = precision,
                                                         .param_offload = offload,
                                                         .optimizer_offload = offload,
                                                         .offload_cpu_copies = offload});
    RANK_CHECK(checks, fsdp->strategy() == expected);
    RANK_CHECK(checks, fsdp->offloaded() == offload);  // from construction on
    ShardedOptimizer opt(fsdp, optim(), "optim");
    size_t trainable = 0;
    for (const auto& p : model->parameters()) trainable += p.requires_grad() ? 1 : 0;
    const int64_t rows = kRows / n, half = rows / 2;
    auto& t = traces[static_cast<size_t>(pg->rank())];
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      double loss_sum = 0.0;
      for (int m = 0; m < 2; ++m) {
        fsdp->set_requires_gradient_sync(m == 1);
        const int64_t count = m == 0 ? half : rows - half;
        const double share = static_cast<double>(count) / static_cast<double>(rows);
        auto loss = c.loss(*model, fsdp.get(), pg->rank() * rows + m * half, count) * share;
        loss.backward();
        fsdp->finish_backward();
        loss_sum += loss.item<double>();
      }
      auto global = torch::tensor({loss_sum}, torch::kDouble);
      pg->all_reduce(global, ReduceOp::avg);
      t.losses.push_back(global.item<double>());
      t.norms.push_back(opt.step(kMaxNorm));
      RANK_CHECK(checks, fsdp->offloaded() == offload);
    }
    // AdamW's two moments for each trainable parameter's shard, none for frozen ones
    RANK_CHECK(checks, opt.state_tensors().size() == 2 * trainable);
    bool float32 = true;
    for (const auto& shard : fsdp->local_shards())
      float32 = float32 && shard.scalar_type() == at::kFloat &&
                (!shard.grad().defined() || shard.grad().scalar_type() == at::kFloat);
    for (const auto& state : opt.state_tensors()) float32 = float32 && state.scalar_type() == at::kFloat;
    RANK_CHECK(checks, float32);
    fsdp->for_each_full_parameter(
        [&](const std::string& name, const at::Tensor& full) { t.weights[name] = full.clone(); });
  });
  checks.report(n * (3 + kSteps));
  return traces;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-12);
}

void check_same_training(const Trace& got, const Trace& ref) {
  REQUIRE(got.losses.size() == ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    CHECK(got.losses[s] == Approx(ref.losses[s]).epsilon(1e-5));
    CHECK(got.norms[s] == Approx(ref.norms[s]).epsilon(1e-5));
  }
  REQUIRE(got.weights.size() == ref.weights.size());
  for (const auto& [name, w] : ref.weights) {
    INFO(name);
    REQUIRE(got.weights.count(name) == 1);
    CHECK(got.weights.at(name).sizes() == w.sizes());
    CHECK(rel_diff(got.weights.at(name), w) <= 1e-5);
  }
}

}  // namespace

TEST_CASE("10 sharded steps on 2 and 4 ranks match one rank on the same global batch (fp32, 1e-5)") {
  const auto c = toy_case();
  const auto ref = train_reference(c);
  CHECK(ref.norms.front() > kMaxNorm);  // the clip is exercised
  CHECK(ref.losses.back() < ref.losses.front());
  for (int n : {2, 4}) {
    SECTION("FULL_SHARD on " + std::to_string(n) + " ranks") {
      for (const auto& t : train_sharded(c, n, -1, true, ShardingStrategy::full_shard)) check_same_training(t, ref);
    }
    SECTION("SHARD_GRAD_OP on " + std::to_string(n) + " ranks") {
      for (const auto& t : train_sharded(c, n, -1, false, ShardingStrategy::shard_grad_op)) check_same_training(t, ref);
    }
    SECTION("NO_SHARD on " + std::to_string(n) + " ranks") {
      for (const auto& t : train_sharded(c, n, 1, true, ShardingStrategy::no_shard)) check_same_training(t, ref);
    }
  }
  SECTION("HYBRID_SHARD on 4 ranks: shard groups of 2, replicated twice") {
    for (const auto& t : train_sharded(c, 4, 2, true, ShardingStrategy::hybrid_shard)) check_same_training(t, ref);
  }
}

TEST_CASE("a language model whose head goes through FsdpModule::head trains as one rank (tied and untied, 1e-5)") {
  for (bool tied : {true, false}) {
    const auto c = lm_case(tied);
    const auto ref = train_reference(c);
    CHECK(ref.norms.front() > kMaxNorm);
    CHECK(ref.losses.back() < ref.losses.front());
    const std::string head = tied ? "tied head" : "untied head";
    for (int n : {2, 4}) {
      SECTION("FULL_SHARD, " + head + ", " + std::to_string(n) + " ranks") {
        for (const auto& t : train_sharded(c, n, -1, true, ShardingStrategy::full_shard)) check_same_training(t, ref);
      }
      SECTION("SHARD_GRAD_OP, " + head + ", " + std::to_string(n) + " ranks") {
        for (const auto& t : train_sharded(c, n, -1, false, ShardingStrategy::shard_grad_op))
          check_same_training(t, ref);
      }
    }
    SECTION("NO_SHARD, " + head + ", 2 ranks") {
      for (const auto& t : train_sharded(c, 2, 1, true, ShardingStrategy::no_shard)) check_same_training(t, ref);
    }
    SECTION("HYBRID_SHARD, " + head + ", 4 ranks in groups of 2") {
      for (const auto& t : train_sharded(c, 4, 2, true, ShardingStrategy::hybrid_shard)) check_same_training(t, ref);
    }
  }
}

TEST_CASE("frozen parameters (LoRA's base) under FSDP: never reduced nor stepped, bit-identical; the rest trains "
          "as one rank") {
  for (bool tied : {true, false}) {
    auto c = lm_case(tied);
    const auto make = c.make;
    c.make = [make] {  // the weights frozen (embedding, layers, head); biases and the scale train
      auto model = make();
      for (auto& item : model->named_parameters())
        if (item.key().ends_with(".weight")) item.value().set_requires_grad(false);
      return model;
    };
    const auto initial = state_of(*make());
    const auto ref = train_reference(c);
    CHECK(ref.losses.back() < ref.losses.front());
    for (int64_t fsdp_size : {int64_t{-1}, int64_t{1}}) {
      CAPTURE(tied, fsdp_size);
      const auto expected = fsdp_size == 1 ? ShardingStrategy::no_shard : ShardingStrategy::full_shard;
      for (const auto& t : train_sharded(c, 2, fsdp_size, true, expected)) {
        check_same_training(t, ref);
        for (const auto& [name, w] : t.weights) {
          INFO(name);
          if (name.ends_with(".weight")) CHECK(torch::equal(w, initial.at(name)));
        }
      }
    }
  }
}

TEST_CASE("FULL_SHARD's peak is the shards plus the root and one layer, never the head weight and its gradient") {
  // bytes of float32: the head weight (rows padded to 38 on 2 ranks only in the shards), the scale
  const int64_t weight = kVocab * kDim * 4, scale = kDim * 4, layer = (kDim * kDim + kDim) * 4;
  REQUIRE(weight > 3 * layer);  // the root's weight is the largest thing a backward gathers
  for (bool engine_head : {true, false}) {
    const auto c = lm_case(true, engine_head);
    test::RankChecks checks;
    std::vector<int64_t> rest(2), peak(2);
    run_ranks(2, [&](const std::shared_ptr<ProcessGroup>& pg) {
      auto model = c.make();
      auto fsdp =
          std::make_shared<FsdpModule>(units_by_layer(named(*model), 0), make_device_mesh(pg, -1), FsdpOptions{});
      ShardedOptimizer opt(fsdp, optim(), "optim");
      for (int s = 0; s < 2; ++s) {  // the second step starts with the shard gradients of the first
        opt.zero_grad();
        fsdp->reset_peak();
        c.loss(*model, fsdp.get(), pg->rank() * 4, 4).backward();
        fsdp->finish_backward();
        opt.step(kMaxNorm);
      }
      const auto r = static_cast<size_t>(pg->rank());
      rest[r] = fsdp->held_bytes();
      peak[r] = fsdp->peak_held_bytes();
      RANK_CHECK(checks, fsdp->materialized_bytes() == 0);
    });
    checks.report(2);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << (engine_head ? ", FsdpModule::head" : ", the plain head"));
      // at rest: the master shards and their gradients (half of the padded rows each)
      CHECK(rest[r] == 2 * 4 * ((kVocab + 1) / 2 * kDim + 3 * (kDim / 2 * kDim + kDim / 2) + kDim / 2));
      if (engine_head) {
        // the forward's root unit with one layer: backward holds less (the weight, then its
        // gradient, the scale with its gradient; a layer's parameters and gradients with the next)
        CHECK(peak[r] == rest[r] + weight + scale + layer);
        CHECK(weight + 2 * scale <= weight + scale + layer);
      } else {
        CHECK(peak[r] >= rest[r] + 2 * weight);  // what the measurement would catch without head()
      }
    }
  }
}

TEST_CASE("param_offload and optimizer_offload (moving to separate host copies) train bit-identically to without") {
  for (bool tied : {true, false}) {
    const auto c = lm_case(tied);
    for (int64_t fsdp_size : {int64_t{-1}, int64_t{1}}) {  // FULL_SHARD, and NO_SHARD (parameters are shards)
      const auto expected = fsdp_size == 1 ? ShardingStrategy::no_shard : ShardingStrategy::full_shard;
      const auto plain = train_sharded(c, 2, fsdp_size, true, expected);
      const auto moved = train_sharded(c, 2, fsdp_size, true, expected, /*offload=*/true);
      for (size_t r = 0; r < 2; ++r) {
        INFO((tied ? "tied" : "untied") << ", fsdp_size " << fsdp_size << ", rank " << r);
        CHECK(moved[r].losses == plain[r].losses);
        CHECK(moved[r].norms == plain[r].norms);
        for (const auto& [name, w] : plain[r].weights) CHECK(torch::equal(moved[r].weights.at(name), w));
      }
    }
  }
}

TEST_CASE("on CPU shards param_offload and optimizer_offload are a no-op: nothing moves") {
  const auto c = lm_case(true);
  test::RankChecks checks;
  run_ranks(2, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = c.make();
    auto fsdp = std::make_shared<FsdpModule>(units_by_layer(named(*model), 0), make_device_mesh(pg, -1),
                                             FsdpOptions{.param_offload = true, .optimizer_offload = true});
    ShardedOptimizer opt(fsdp, optim(), "optim");
    const void* before = fsdp->local_shards().front().data_ptr();
    c.loss(*model, fsdp.get(), pg->rank() * 4, 4).backward();
    fsdp->finish_backward();
    opt.step(kMaxNorm);
    RANK_CHECK(checks, !fsdp->offload_moves());
    RANK_CHECK(checks, !fsdp->offloaded());
    RANK_CHECK(checks, fsdp->local_shards().front().data_ptr() == before);  // the same memory all along
  });
  checks.report(2 * 3);
}

TEST_CASE("units follow the wrap policy: one per layer, small layers join the root") {
  auto model = toy_from(initial_state());
  auto units = units_by_layer(named(*model), 0);
  REQUIRE(units.size() == 4);
  CHECK(units[0].name == "layers.0");
  CHECK(units[2].parameters.size() == 2);
  CHECK(units.back().name == "root");
  CHECK(units.back().parameters.size() == 4);       // embed and head, weight and bias
  auto merged = units_by_layer(named(*model), 43);  // a layer has 6 * 6 + 6 = 42 parameters
  REQUIRE(merged.size() == 1);
  CHECK(merged[0].parameters.size() == 10);
}

TEST_CASE("FULL_SHARD keeps 1/N of the parameters between steps and at most two units plus the root in forward") {
  const auto state = initial_state();
  test::RankChecks checks;
  run_ranks(2, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = toy_from(state);
    auto fsdp = std::make_shared<FsdpModule>(units_by_layer(named(*model), 0), make_device_mesh(pg, -1), FsdpOptions{});
    RANK_CHECK(checks, fsdp->materialized_bytes() == 0);
    // rows padded to a multiple of 2: embed 6x5+6, layers 3 x (6x6+6), head 4x6+4 -> half each
    RANK_CHECK(checks, fsdp->sharded_bytes() == (36 + 3 * 42 + 28) / 2 * 4);
    torch::NoGradGuard no_grad;
    auto [x, y] = data();
    auto out = model->forward(x, fsdp.get());
    fsdp->end_forward();
    RANK_CHECK(checks, fsdp->materialized_bytes() == 0);
    const int64_t root = (36 + 21) * 4, layer = 42 * 4;
    RANK_CHECK(checks, fsdp->peak_materialized_bytes() <= root + 2 * layer);
    RANK_CHECK(checks, fsdp->peak_materialized_bytes() >= root + layer);
    RANK_CHECK(checks, torch::allclose(out, toy_from(state)->forward(x, nullptr), 1e-6, 1e-7));
  });
  checks.report(2 * 6);
}

TEST_CASE("full parameters (a state dict) load into the shards of 4 ranks and gather back equal") {
  const auto state = initial_state();
  test::RankChecks checks;
  run_ranks(4, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = toy_from(state);
    auto fsdp = std::make_shared<FsdpModule>(units_by_layer(named(*model), 0), make_device_mesh(pg, -1), FsdpOptions{});
    auto other = toy_from(state);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : other->parameters()) p.mul_(2);
    }
    fsdp->load_full_parameters(named(*other), "doubled");
    fsdp->for_each_full_parameter([&](const std::string& name, const at::Tensor& full) {
      RANK_CHECK(checks, torch::equal(full, state.at(name) * 2));
    });
    auto bad = named(*other);
    bad[0].tensor = torch::zeros({2, 2});
    checks.throws<hyflow::ShapeError>([&] { fsdp->load_full_parameters(bad, "bad"); }, "a parameter of another shape");
  });
  checks.report(4 * (10 + 1));  // 10 parameters and the error on each rank
}

TEST_CASE("a rank that leaves mid-step fails the others' collective with the group's name, no hang") {
  const auto state = initial_state();
  const int port = pick_free_port();
  std::vector<std::thread> threads;
  std::string error;
  std::mutex mutex;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        auto pg = std::make_shared<ProcessGroup>(ProcessGroupOptions{
            .rank = r, .world_size = 2, .master_port = port, .timeout = std::chrono::seconds(2), .name = "toy"});
        auto model = toy_from(state);
        FsdpModule fsdp(units_by_layer(named(*model), 0), make_device_mesh(pg, -1), FsdpOptions{});
        pg->barrier();
        if (r == 1) return;  // dies before the step
        auto [x, y] = data();
        model->forward(x, &fsdp);
      } catch (const hyflow::Error& e) {
        std::lock_guard lock(mutex);
        error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  CHECK_THAT(error, Catch::Contains("all_gather_into_tensor of group 'toy'"));
}

TEST_CASE("fsdp_size must divide the world size") {
  test::RankChecks checks;
  run_ranks(3, [&](const std::shared_ptr<ProcessGroup>& pg) {
    checks.throws<hyflow::ValueError>([&] { make_device_mesh(pg, 2); }, "make_device_mesh(pg, 2) on 3 ranks",
                                      {"fsdp_size 2", "world size 3"});
  });
  checks.report(3);
  CHECK_THROWS_WITH(parse_dtype("fp8", "fsdp_config.mixed_precision.param_dtype"),
                    Catch::Contains("param_dtype") && Catch::Contains("fp8"));
}

namespace {

// The meshes of mixed precision's tests: every strategy, and one rank (replicated).
struct Layout {
  const char* name;
  int ranks;
  int64_t fsdp_size;
  bool reshard_after_forward;
  ShardingStrategy strategy;
};
const std::vector<Layout> kLayouts = {
    {"one rank", 1, -1, true, ShardingStrategy::no_shard},
    {"FULL_SHARD", 2, -1, true, ShardingStrategy::full_shard},
    {"SHARD_GRAD_OP", 2, -1, false, ShardingStrategy::shard_grad_op},
    {"NO_SHARD", 2, 1, true, ShardingStrategy::no_shard},
    {"HYBRID_SHARD", 4, 2, true, ShardingStrategy::hybrid_shard},
};

bool bf16_representable(const at::Tensor& t) {
  return torch::equal(t, t.to(at::kBFloat16).to(at::kFloat));
}

// The float32 gradients of the master shards after one backward per micro-batch (rows [begin,
// begin + count) of the global batch each; only the last one synchronizes), from zero.
std::vector<at::Tensor> shard_grads(const Case& c, torch::nn::Module& model, FsdpModule& fsdp,
                                    const std::vector<std::pair<int64_t, int64_t>>& micro_batches) {
  for (auto shard : fsdp.local_shards()) shard.mutable_grad().reset();
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    fsdp.set_requires_gradient_sync(m + 1 == micro_batches.size());
    c.loss(model, &fsdp, micro_batches[m].first, micro_batches[m].second).backward();
    fsdp.finish_backward();
  }
  std::vector<at::Tensor> out;
  for (const auto& shard : fsdp.local_shards()) out.push_back(shard.grad().clone());
  return out;
}

}  // namespace

// Bounds of bf16 compute against float32 on the toy LM (bf16 keeps 8 bits of mantissa: a relative
// rounding of 2^-9 per operation): the loss of every step within 2%, the trained weights within 15%
// of the largest weight after 10 AdamW steps at lr 0.05 (AdamW moves every element by about lr per
// step whatever its gradient's size, so elements with tiny gradients drift further than the loss:
// 12% at most here).
TEST_CASE("bf16 compute (fp32 masters, fp32 reduce) trains close to fp32 in every strategy and on one rank") {
  constexpr double kLossBound = 0.02, kWeightBound = 0.15;
  const MixedPrecision bf16{.param_dtype = at::kBFloat16};
  for (bool tied : {true, false}) {
    const auto c = lm_case(tied);
    const auto ref = train_reference(c);
    for (const auto& layout : kLayouts) {
      CAPTURE(tied, layout.name);
      const auto traces = train_sharded(c, layout.ranks, layout.fsdp_size, layout.reshard_after_forward,
                                        layout.strategy, /*offload=*/false, bf16);
      for (const auto& t : traces) {
        REQUIRE(t.losses.size() == ref.losses.size());
        double worst = 0.0;
        for (size_t s = 0; s < ref.losses.size(); ++s)
          worst = std::max(worst, std::abs(t.losses[s] - ref.losses[s]) / std::abs(ref.losses[s]));
        CHECK(worst > 0.0);  // bf16 really computes
        CHECK(worst <= kLossBound);
        CHECK(t.losses.back() < t.losses.front());
        for (const auto& [name, w] : ref.weights) {
          INFO(name);
          CHECK(t.weights.at(name).scalar_type() == at::kBFloat16);  // the gathered compute copies
          CHECK(rel_diff(t.weights.at(name).to(at::kFloat), w) <= kWeightBound);
        }
      }
    }
  }
}

TEST_CASE("bf16 compute with frozen parameters (LoRA's base): they stay bit-identical, the rest trains") {
  const MixedPrecision bf16{.param_dtype = at::kBFloat16};
  auto c = lm_case(/*tied=*/false);
  const auto make = c.make;
  c.make = [make] {  // as LoRA: the weights frozen, biases and the scale train
    auto model = make();
    for (auto& item : model->named_parameters())
      if (item.key().ends_with(".weight")) item.value().set_requires_grad(false);
    return model;
  };
  const auto initial = state_of(*make());
  for (const auto& layout : {kLayouts[0], kLayouts[1]}) {
    CAPTURE(layout.name);
    for (const auto& t : train_sharded(c, layout.ranks, layout.fsdp_size, layout.reshard_after_forward,
                                       layout.strategy, /*offload=*/false, bf16)) {
      CHECK(t.losses.back() < t.losses.front());
      for (const auto& [name, w] : t.weights) {
        INFO(name);
        if (name.ends_with(".weight")) CHECK(torch::equal(w, initial.at(name).to(at::kBFloat16)));
      }
    }
  }
}

TEST_CASE("bf16 gradients of micro-batches without gradient sync are summed in float32, not in bf16") {
  // One rank: the reduced gradient is the sum itself (no averaging to round it), so the two
  // micro-batches' gradients must add up exactly to what each gives alone. Untied: each parameter
  // gets one gradient per micro-batch (a tied weight's two would add in another order). The head
  // goes through FsdpModule::head, the embedding through autograd.
  const MixedPrecision bf16{.param_dtype = at::kBFloat16};
  {
    const auto c = lm_case(/*tied=*/false);
    auto model = c.make();
    FsdpModule fsdp(units_by_layer(named(*model), 0), DeviceMesh{}, FsdpOptions{.mixed_precision = bf16});
    const auto first = shard_grads(c, *model, fsdp, {{0, 4}});
    const auto second = shard_grads(c, *model, fsdp, {{4, 4}});
    const auto both = shard_grads(c, *model, fsdp, {{0, 4}, {4, 4}});
    REQUIRE(both.size() == first.size());
    bool rounded_sum = false;  // the float32 sum is not a bf16 number somewhere (else the test proves nothing)
    for (size_t i = 0; i < both.size(); ++i) {
      CHECK(both[i].scalar_type() == at::kFloat);
      CHECK(torch::equal(both[i], first[i] + second[i]));
      rounded_sum = rounded_sum || !bf16_representable(first[i] + second[i]);
    }
    CHECK(rounded_sum);
  }
}

TEST_CASE("reduce_dtype bf16 reduces gradients in bf16 (rounded to it), fp32 does not, in every strategy") {
  const auto c = lm_case(/*tied=*/false);
  for (const auto& layout : kLayouts) {
    for (auto reduce : {at::kFloat, at::kBFloat16}) {
      CAPTURE(layout.name, c10::toString(reduce));
      std::vector<int> representable(static_cast<size_t>(layout.ranks), 0);
      run_ranks(layout.ranks, [&](const std::shared_ptr<ProcessGroup>& pg) {
        auto model = c.make();
        FsdpModule fsdp(units_by_layer(named(*model), 0), make_device_mesh(pg, layout.fsdp_size),
                        FsdpOptions{.reshard_after_forward = layout.reshard_after_forward,
                                    .mixed_precision = {.reduce_dtype = reduce}});
        const int64_t rows = kRows / layout.ranks;
        bool all = true;
        for (const auto& g : shard_grads(c, *model, fsdp, {{pg->rank() * rows, rows}}))
          all = all && g.scalar_type() == at::kFloat && bf16_representable(g);
        representable[static_cast<size_t>(pg->rank())] = all ? 1 : 0;
      });
      for (int r : representable) CHECK(r == (reduce == at::kBFloat16 ? 1 : 0));
    }
  }
}

TEST_CASE("a checkpoint saved under bf16 compute holds the fp32 masters and reloads them bit-exact") {
  const auto c = lm_case(/*tied=*/true);
  const MixedPrecision bf16{.param_dtype = at::kBFloat16};
  for (int n : {1, 2}) {
    CAPTURE(n);
    const auto dir = std::filesystem::temp_directory_path() /
                     ("hyflow_fsdp_bf16_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(n));
    std::filesystem::remove_all(dir);
    test::RankChecks checks;
    std::vector<std::vector<at::Tensor>> saved(static_cast<size_t>(n));
    run_ranks(n, [&](const std::shared_ptr<ProcessGroup>& pg) {
      auto model = c.make();
      auto fsdp = std::make_shared<FsdpModule>(units_by_layer(named(*model), 0), make_device_mesh(pg, -1),
                                               FsdpOptions{.mixed_precision = bf16});
      ShardedOptimizer opt(fsdp, optim(), "optim");
      const int64_t rows = kRows / n;
      for (int s = 0; s < 3; ++s) {
        opt.zero_grad();
        shard_grads(c, *model, *fsdp, {{pg->rank() * rows, rows}});
        opt.step(kMaxNorm);
      }
      save_sharded_checkpoint(*fsdp, &opt, dir, nlohmann::json::object(), pg.get());
      auto& mine = saved[static_cast<size_t>(pg->rank())];
      for (const auto& shard : fsdp->local_shards()) mine.push_back(shard.clone());
      auto fresh = c.make();
      FsdpModule back(units_by_layer(named(*fresh), 0), make_device_mesh(pg, -1), FsdpOptions{.mixed_precision = bf16});
      load_sharded_parameters(back, dir);
      const auto loaded = back.local_shards();
      RANK_CHECK(checks, loaded.size() == mine.size());
      for (size_t i = 0; i < loaded.size() && i < mine.size(); ++i)
        RANK_CHECK(checks, loaded[i].scalar_type() == at::kFloat && torch::equal(loaded[i], mine[i]));
    });
    checks.report(n);
    bool beyond_bf16 = false;  // the masters trained in float32: not all of them are bf16 numbers
    for (const auto& p : load_sharded_parameters(dir)) {
      CHECK(p.tensor.scalar_type() == at::kFloat);
      beyond_bf16 = beyond_bf16 || !bf16_representable(p.tensor);
    }
    CHECK(beyond_bf16);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("buffer_dtype casts floating-point buffers only; parameters and integer buffers keep their dtype") {
  torch::nn::BatchNorm1d norm(4);
  cast_buffers(*norm, at::kBFloat16);
  CHECK(norm->running_mean.scalar_type() == at::kBFloat16);
  CHECK(norm->running_var.scalar_type() == at::kBFloat16);
  CHECK(norm->num_batches_tracked.scalar_type() == at::kLong);
  CHECK(norm->weight.scalar_type() == at::kFloat);
}

TEST_CASE("the optimizers take algos' schedule by name: cosine warms up and decays, another name fails with its key") {
  auto w = torch::zeros({2}, torch::requires_grad());
  OptimConfig o = optim();
  o.lr_scheduler_type = "cosine";
  o.lr_warmup_steps = 2;
  o.total_training_steps = 10;
  o.min_lr_ratio = 0.1;
  DataParallelOptimizer opt({w}, o, nullptr, "actor.optim");
  const auto expected = algos::core_algos::get_cosine_schedule_with_warmup(2, 10, 0.1, 0.5);
  for (int64_t step = 0; step < 12; ++step) {
    CHECK(opt.lr() == o.lr * expected(step));
    opt.scheduler_step();
  }
  o.lr_scheduler_type = "linear";
  CHECK_THROWS_WITH(DataParallelOptimizer({w}, o, nullptr, "actor.optim"),
                    Catch::Contains("'actor.optim.lr_scheduler_type'") && Catch::Contains("'linear'"));
}

TEST_CASE("a replicated engine in bf16 casts each compute copy once per master version: unchanged ones are not "
          "written again") {
  // A rollout engine keeps what it packed of a weight while the weight's version counter stays: a copy
  // rewritten with the same values at every gather would make it repack the whole model every rollout.
  const auto c = lm_case(/*tied=*/false);
  auto model = c.make();
  const MixedPrecision bf16{.param_dtype = at::kBFloat16};
  FsdpModule fsdp(units_by_layer(named(*model), 0), DeviceMesh{}, FsdpOptions{.mixed_precision = bf16});
  const auto named_params = model->named_parameters();
  auto versions = [&] {
    std::map<std::string, int64_t> v;
    for (const auto& item : named_params) v[item.key()] = static_cast<int64_t>(item.value()._version());
    return v;
  };
  fsdp.unshard_all();
  fsdp.reshard_all();
  const auto cast = versions();
  fsdp.unshard_all();
  fsdp.reshard_all();
  fsdp.begin_forward();
  fsdp.end_forward();
  CHECK(versions() == cast);  // the masters did not change: no copy was written
  const std::string stepped = fsdp.shard_infos().front().name;
  {
    torch::NoGradGuard no_grad;
    fsdp.local_shards().front().add_(1.0);  // as an optimizer step writes a master
  }
  fsdp.unshard_all();
  auto after = versions();
  CHECK(after.at(stepped) != cast.at(stepped));  // recast, and only that one
  after[stepped] = cast.at(stepped);
  CHECK(after == cast);
  CHECK(torch::equal(named_params[stepped].to(at::kFloat).view({-1}),
                     fsdp.local_shards().front().to(at::kBFloat16).to(at::kFloat).view({-1})));
  fsdp.reshard_all();
}
