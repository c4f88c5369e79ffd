#include "rank_threads.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/core/net.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <sched.h>

#include <atomic>
#include <thread>

using namespace hyflow;
using namespace hyflow::parallel;

using test::run_ranks;

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
  test::RankChecks checks;
  run_ranks(3, [&](ProcessGroup& pg) {
    auto a = torch::full({2}, float(pg.rank()));
    pg.all_reduce(a, ReduceOp::avg);
    RANK_CHECK(checks, a[0].item<float>() == 1.f);  // (0 + 1 + 2) / 3, exact in float
    auto m = torch::full({1}, float(pg.rank() * 5));
    pg.all_reduce(m, ReduceOp::max);
    RANK_CHECK(checks, m.item<float>() == 10.f);
    auto b = torch::full({2}, float(pg.rank() == 2 ? 7 : 0));
    pg.broadcast(b, 2);
    RANK_CHECK(checks, b[1].item<float>() == 7.f);
    auto g = pg.all_gather(torch::full({1}, float(pg.rank() * 2)));
    RANK_CHECK(checks, g.size() == 3 && g[2].item<float>() == 4.f);
    pg.barrier();
  });
  checks.report(3 * 4);
}

TEST_CASE("an nccl group that cannot form is a clear error, in every build") {
  const int port = pick_free_port();
  ProcessGroupOptions o{.rank = 0,
                        .world_size = 2,
                        .master_port = port,
                        .backend = Backend::nccl,
                        .timeout = std::chrono::milliseconds(300),
                        .device = 0};
  if (!nccl_available()) {
    CHECK_THROWS_WITH(ProcessGroup(o), Catch::Contains("nccl") && Catch::Contains("CUDA"));
  } else {  // no device (cudaGetDevice fails) or rank 1 never joins (named by the store barrier)
    CHECK_THROWS_AS(ProcessGroup(o), hyflow::Error);
  }
}

TEST_CASE("an nccl group without the rank's device is refused, naming the problem, before any rendezvous") {
  ProcessGroupOptions o{.rank = 1, .world_size = 2, .master_port = pick_free_port(), .backend = Backend::nccl};
  CHECK_THROWS_AS(ProcessGroup(o), ValueError);
  CHECK_THROWS_WITH(ProcessGroup(o), Catch::Contains("needs the rank's CUDA device") && Catch::Contains("got -1") &&
                                         Catch::Contains("share one GPU"));
}

TEST_CASE("collectives pick their backend by the tensor's device: CPU tensors never go to NCCL") {
  // an nccl group: CUDA tensors (any index) to NCCL, CPU tensors to its gloo side
  CHECK(collective_backend(Backend::nccl, c10::Device("cuda:0")) == Backend::nccl);
  CHECK(collective_backend(Backend::nccl, c10::Device("cuda:3")) == Backend::nccl);
  CHECK(collective_backend(Backend::nccl, c10::Device("cuda")) == Backend::nccl);
  CHECK(collective_backend(Backend::nccl, c10::Device(c10::kCPU)) == Backend::gloo);
  CHECK(collective_backend(Backend::nccl, torch::tensor({1.0}).device()) == Backend::gloo);
  // a gloo group runs everything on gloo
  CHECK(collective_backend(Backend::gloo, c10::Device("cuda:1")) == Backend::gloo);
  CHECK(collective_backend(Backend::gloo, c10::Device(c10::kCPU)) == Backend::gloo);
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

TEST_CASE("gloo all_gather_into_tensor and reduce_scatter over 3 ranks") {
  test::RankChecks checks;
  run_ranks(3, [&](ProcessGroup& pg) {
    auto out = torch::zeros({6});
    pg.all_gather_into_tensor(out, torch::full({2}, float(pg.rank())));
    RANK_CHECK(checks, torch::equal(out, torch::tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f})));
    auto input = torch::arange(6, torch::kFloat) * float(pg.rank() + 1);  // sum over ranks: 6 * arange
    auto mine = torch::zeros({2});
    pg.reduce_scatter(mine, input);
    RANK_CHECK(checks, torch::equal(mine, torch::tensor({12.f * pg.rank(), 12.f * pg.rank() + 6.f})));
    auto avg = torch::zeros({2});
    pg.reduce_scatter(avg, input, ReduceOp::avg);
    RANK_CHECK(checks, torch::allclose(avg, mine / 3));
    pg.synchronize();  // gloo collectives are synchronous: nothing pending
    checks.throws<hyflow::ShapeError>([&] { pg.reduce_scatter(mine, torch::zeros({5})); },
                                      "reduce_scatter into a tensor of 5 from 6 over 3 ranks");
  });
  checks.report(3 * 4);
}

TEST_CASE("ranks exchange an NCCL-style unique id through the group's store") {
  std::vector<std::vector<uint8_t>> ids(3);
  run_ranks(3, [&](ProcessGroup& pg) {
    ids[static_cast<size_t>(pg.rank())] = exchange_unique_id(
        pg.store(), pg.rank(), "uid",
        [] {
          return std::vector<uint8_t>{7, 1, 9, 4};
        },
        std::chrono::seconds(10));
    store_barrier(pg.store(), "joined", pg.rank(), pg.size(), std::chrono::seconds(10));
  });
  CHECK(ids[0] == std::vector<uint8_t>{7, 1, 9, 4});
  CHECK(ids[1] == ids[0]);
  CHECK(ids[2] == ids[0]);
}

namespace {
/// `n` ranks on threads; each builds its group (with `peer_timeout`) and hands it to the caller.
struct ThreadRanks {
  std::vector<std::unique_ptr<ProcessGroup>> groups;
  ThreadRanks(int n, std::chrono::milliseconds peer_timeout) : groups(static_cast<size_t>(n)) {
    const int port = pick_free_port();
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        groups[static_cast<size_t>(r)] = std::make_unique<ProcessGroup>(ProcessGroupOptions{
            .rank = r, .world_size = n, .master_port = port, .timeout = std::chrono::seconds(20),
            .peer_timeout = peer_timeout});
      });
    for (auto& t : threads) t.join();
  }
};
}  // namespace

TEST_CASE("abort() frees the ranks waiting in a gloo all_reduce, with the reason, and refuses later collectives") {
  ThreadRanks ranks(3, std::chrono::milliseconds(0));  // no liveness: only abort() can free them
  std::vector<std::string> errors(2);
  std::vector<std::thread> waiting;
  for (int r = 0; r < 2; ++r)
    waiting.emplace_back([&, r] {
      auto t = torch::ones({4});
      try {
        ranks.groups[static_cast<size_t>(r)]->all_reduce(t);  // rank 2 never comes
      } catch (const CollectiveAbortedError& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ranks.groups[0]->abort("the controller saw rank 2 die");
  ranks.groups[1]->abort("the controller saw rank 2 die");
  for (auto& t : waiting) t.join();
  for (const auto& e : errors)
    CHECK_THAT(e, Catch::Contains("gloo all_reduce of group 'default'") &&
                      Catch::Contains("was aborted: the controller saw rank 2 die"));
  CHECK(ranks.groups[0]->aborted() == std::optional<std::string>("the controller saw rank 2 die"));
  CHECK_FALSE(ranks.groups[2]->aborted().has_value());
  auto t = torch::ones({4});
  CHECK_THROWS_WITH(ranks.groups[0]->broadcast(t, 0), Catch::Contains("refused: the group was aborted"));
  ranks.groups.clear();  // rank 2's exit ends the abandoned gloo work; nothing blocks here
}

TEST_CASE("a peer that is late but alive does not trip the liveness check") {
  ThreadRanks ranks(3, std::chrono::milliseconds(300));
  std::vector<float> sums(3, 0.f);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // four peer timeouts late
      auto t = torch::full({2}, float(r + 1));
      ranks.groups[static_cast<size_t>(r)]->all_reduce(t);
      sums[static_cast<size_t>(r)] = t[0].item<float>();
    });
  for (auto& t : threads) t.join();
  CHECK(sums == std::vector<float>{6.f, 6.f, 6.f});
  for (auto& g : ranks.groups) CHECK_FALSE(g->aborted().has_value());
}

TEST_CASE("a gloo collective returns once gloo has let go of its tensors: they are the caller's alone") {
  // gloo's worker thread completes a collective (waking the waiter) and only then drops its
  // references to the work, which holds the tensors. On one CPU the woken waiter usually runs
  // before the worker drops them, so without waiting for the release most returns here find the
  // tensors still referenced (broadcast_parameters' staging buffer was then freed late, on gloo's
  // thread: test_data_parallel's CountingScope saw 256 KiB "live" under load).
  cpu_set_t all_cpus, one_cpu;
  REQUIRE(sched_getaffinity(0, sizeof all_cpus, &all_cpus) == 0);
  CPU_ZERO(&one_cpu);
  CPU_SET(sched_getcpu(), &one_cpu);
  REQUIRE(sched_setaffinity(0, sizeof one_cpu, &one_cpu) == 0);  // the rank and gloo threads inherit it
  constexpr int kRounds = 200;
  std::atomic<int> held{0};
  for (const int n : {1, 2}) {
    run_ranks(n, [&](ProcessGroup& pg) {
      for (int i = 0; i < kRounds; ++i) {
        auto t = torch::full({256}, float(i + pg.rank()));
        pg.broadcast(t, 0);
        if (t.use_count() != 1 || t.storage().use_count() != 1) ++held;
        auto s = torch::full({256}, float(i));
        pg.all_reduce(s);
        if (s.use_count() != 1 || s.storage().use_count() != 1) ++held;
      }
    });
  }
  REQUIRE(sched_setaffinity(0, sizeof all_cpus, &all_cpus) == 0);
  INFO(held.load() << " of " << 2 * 3 * kRounds << " collectives returned with gloo still holding their tensor");
  CHECK(held.load() == 0);
}
