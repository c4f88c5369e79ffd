#include <hyflow/core/error.hpp>
#include <hyflow/core/net.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <thread>

using namespace hyflow;
using namespace hyflow::parallel;

namespace {
/// Runs fn(rank) on `n` threads, each with its own process group on one store.
template <class Fn>
void run_ranks(int n, Fn fn) {
  const int port = pick_free_port();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        ProcessGroup pg({.rank = r, .world_size = n, .master_port = port, .timeout = std::chrono::seconds(20)});
        fn(pg);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}
}  // namespace

TEST_CASE("gloo all_reduce of rank+1 over 4 ranks sums to 10 everywhere") {
  std::vector<float> seen(4, 0.f);
  run_ranks(4, [&](ProcessGroup& pg) {
    auto t = torch::full({3}, float(pg.rank() + 1));
    pg.all_reduce(t);
    seen[static_cast<size_t>(pg.rank())] = t[2].item<float>();
  });
  CHECK(seen == std::vector<float>{10.f, 10.f, 10.f, 10.f});
}

TEST_CASE("gloo avg, max, broadcast and all_gather over 3 ranks") {
  run_ranks(3, [&](ProcessGroup& pg) {
    auto a = torch::full({2}, float(pg.rank()));
    pg.all_reduce(a, ReduceOp::avg);
    CHECK(a[0].item<float>() == Approx(1.0));
    auto m = torch::full({1}, float(pg.rank() * 5));
    pg.all_reduce(m, ReduceOp::max);
    CHECK(m.item<float>() == 10.f);
    auto b = torch::full({2}, float(pg.rank() == 2 ? 7 : 0));
    pg.broadcast(b, 2);
    CHECK(b[1].item<float>() == 7.f);
    auto g = pg.all_gather(torch::full({1}, float(pg.rank() * 2)));
    REQUIRE(g.size() == 3);
    CHECK(g[2].item<float>() == 4.f);
    pg.barrier();
  });
}

TEST_CASE("nccl backend without a CUDA build is a clear error") {
  if (nccl_available()) return;
  ProcessGroupOptions o{.rank = 0, .world_size = 1, .master_port = 12345, .backend = Backend::nccl};
  CHECK_THROWS_WITH(ProcessGroup(o), Catch::Contains("nccl") && Catch::Contains("CUDA"));
}

TEST_CASE("bad rank and port are rejected with their values") {
  CHECK_THROWS_WITH(ProcessGroup({.rank = 3, .world_size = 2, .master_port = 1000}), Catch::Contains("rank 3"));
  CHECK_THROWS_WITH(ProcessGroup({.rank = 0, .world_size = 1, .master_port = 0}), Catch::Contains("port 0"));
}

TEST_CASE("a missing peer times out naming the rank and the store") {
  const int port = pick_free_port();
  ProcessGroupOptions o{.rank = 1, .world_size = 2, .master_port = port, .timeout = std::chrono::milliseconds(500)};
  CHECK_THROWS_WITH(ProcessGroup(o), Catch::Contains("rank 1 of 2") && Catch::Contains(std::to_string(port)));
}
