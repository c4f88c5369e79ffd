#include "rank_threads.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/core/net.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <map>
#include <mutex>
#include <thread>

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

std::map<std::string, at::Tensor> initial_state() {
  torch::manual_seed(7);
  Toy model;
  std::map<std::string, at::Tensor> state;
  for (const auto& item : model->named_parameters()) state[item.key()] = item.value().detach().clone();
  return state;
}

Toy toy_from(const std::map<std::string, at::Tensor>& state) {
  Toy model;
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) item.value().copy_(state.at(item.key()));
  return model;
}

std::vector<NamedParameter> named(Toy& model) {
  std::vector<NamedParameter> out;
  for (const auto& item : model->named_parameters()) out.push_back({item.key(), item.value()});
  return out;
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

struct Trace {
  std::vector<double> losses, norms;
  std::map<std::string, at::Tensor> weights;
};

// One rank, the whole batch, the replicated optimizer: the reference.
Trace train_reference(const std::map<std::string, at::Tensor>& state) {
  auto model = toy_from(state);
  DataParallelOptimizer opt(model->parameters(), optim(), nullptr, "optim");
  auto [x, y] = data();
  Trace t;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto loss = torch::mse_loss(model->forward(x, nullptr), y);
    loss.backward();
    t.losses.push_back(loss.item<double>());
    t.norms.push_back(opt.step(kMaxNorm));
  }
  for (const auto& item : model->named_parameters()) t.weights[item.key()] = item.value().detach().clone();
  return t;
}

using test::run_ranks;

// n ranks, each with kRows / n rows in two micro-batches (gradient accumulation: only the last
// one synchronizes), the sharded optimizer.
std::vector<Trace> train_sharded(const std::map<std::string, at::Tensor>& state, int n, int64_t fsdp_size,
                                 bool reshard_after_forward, ShardingStrategy expected) {
  std::vector<Trace> traces(static_cast<size_t>(n));
  test::RankChecks checks;
  run_ranks(n, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = toy_from(state);
    auto fsdp = std::make_shared<FsdpModule>(units_by_layer(named(model), 0), make_device_mesh(pg, fsdp_size),
                                             FsdpOptions{.reshard_after_forward = reshard_after_forward});
    RANK_CHECK(checks, fsdp->strategy() == expected);
    ShardedOptimizer opt(fsdp, optim(), "optim");
    auto [x, y] = data();
    const int64_t rows = kRows / n;
    auto mine_x = x.narrow(0, pg->rank() * rows, rows), mine_y = y.narrow(0, pg->rank() * rows, rows);
    auto& t = traces[static_cast<size_t>(pg->rank())];
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      double loss_sum = 0.0;
      const auto xs = mine_x.chunk(2), ys = mine_y.chunk(2);
      for (size_t m = 0; m < xs.size(); ++m) {
        fsdp->set_requires_gradient_sync(m + 1 == xs.size());
        const double share = static_cast<double>(xs[m].size(0)) / static_cast<double>(rows);
        auto loss = torch::mse_loss(model->forward(xs[m], fsdp.get()), ys[m]) * share;
        loss.backward();
        fsdp->finish_backward();
        loss_sum += loss.item<double>();
      }
      auto global = torch::tensor({loss_sum}, torch::kDouble);
      pg->all_reduce(global, ReduceOp::avg);
      t.losses.push_back(global.item<double>());
      t.norms.push_back(opt.step(kMaxNorm));
    }
    fsdp->for_each_full_parameter(
        [&](const std::string& name, const at::Tensor& full) { t.weights[name] = full.clone(); });
  });
  checks.report(n);
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
  const auto state = initial_state();
  const auto ref = train_reference(state);
  CHECK(ref.norms.front() > kMaxNorm);  // the clip is exercised
  CHECK(ref.losses.back() < ref.losses.front());
  for (int n : {2, 4}) {
    SECTION("FULL_SHARD on " + std::to_string(n) + " ranks") {
      for (const auto& t : train_sharded(state, n, -1, true, ShardingStrategy::full_shard)) check_same_training(t, ref);
    }
    SECTION("SHARD_GRAD_OP on " + std::to_string(n) + " ranks") {
      for (const auto& t : train_sharded(state, n, -1, false, ShardingStrategy::shard_grad_op))
        check_same_training(t, ref);
    }
    SECTION("NO_SHARD on " + std::to_string(n) + " ranks") {
      for (const auto& t : train_sharded(state, n, 1, true, ShardingStrategy::no_shard)) check_same_training(t, ref);
    }
  }
  SECTION("HYBRID_SHARD on 4 ranks: shard groups of 2, replicated twice") {
    for (const auto& t : train_sharded(state, 4, 2, true, ShardingStrategy::hybrid_shard)) check_same_training(t, ref);
  }
}

TEST_CASE("units follow the wrap policy: one per layer, small layers join the root") {
  auto model = toy_from(initial_state());
  auto units = units_by_layer(named(model), 0);
  REQUIRE(units.size() == 4);
  CHECK(units[0].name == "layers.0");
  CHECK(units[2].parameters.size() == 2);
  CHECK(units.back().name == "root");
  CHECK(units.back().parameters.size() == 4);      // embed and head, weight and bias
  auto merged = units_by_layer(named(model), 43);  // a layer has 6 * 6 + 6 = 42 parameters
  REQUIRE(merged.size() == 1);
  CHECK(merged[0].parameters.size() == 10);
}

TEST_CASE("FULL_SHARD keeps 1/N of the parameters between steps and at most two units plus the root in forward") {
  const auto state = initial_state();
  test::RankChecks checks;
  run_ranks(2, [&](const std::shared_ptr<ProcessGroup>& pg) {
    auto model = toy_from(state);
    auto fsdp = std::make_shared<FsdpModule>(units_by_layer(named(model), 0), make_device_mesh(pg, -1), FsdpOptions{});
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
    auto fsdp = std::make_shared<FsdpModule>(units_by_layer(named(model), 0), make_device_mesh(pg, -1), FsdpOptions{});
    auto other = toy_from(state);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : other->parameters()) p.mul_(2);
    }
    fsdp->load_full_parameters(named(other), "doubled");
    fsdp->for_each_full_parameter([&](const std::string& name, const at::Tensor& full) {
      RANK_CHECK(checks, torch::equal(full, state.at(name) * 2));
    });
    auto bad = named(other);
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
        FsdpModule fsdp(units_by_layer(named(model), 0), make_device_mesh(pg, -1), FsdpOptions{});
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
