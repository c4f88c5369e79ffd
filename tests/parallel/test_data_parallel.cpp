// broadcast_parameters (bit-identical ranks in every dtype, memory bounded by the bucket cap, measured
// with a counting CPU allocator) and the bool reduce ops of both backends, over in-process gloo ranks.

#include "rank_threads.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

using namespace hyflow::parallel;

namespace {

/// Parameters and buffers of every kind broadcast_parameters meets; `rank` makes them differ.
std::vector<at::Tensor> make_tensors(int rank) {
  // values from `rank` alone (no shared random generator: ranks are threads)
  auto wave = [rank](int64_t n, at::ScalarType dtype) {
    return torch::sin(torch::arange(n, torch::kFloat64) * (1.37 + rank) + rank).to(dtype);
  };
  const int64_t big = (int64_t{1} << 60) + 1 + rank;  // no float64 holds it
  return {
      wave(12, torch::kFloat).view({3, 4}),
      wave(5, torch::kFloat64),
      wave(21, torch::kBFloat16).view({7, 3}),
      torch::full({2}, big, torch::kLong),
      torch::arange(rank, rank + 6, torch::kInt),
      torch::tensor({rank == 0, true, rank != 0}),
      wave(24, torch::kFloat).view({4, 6}).t(),  // not contiguous
      torch::empty({0}),
      wave(9, torch::kHalf),
      wave(4, torch::kFloat).view({2, 2}),
  };
}

void check_equal(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, test::RankChecks& checks,
                 int rank) {
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = got[i].scalar_type() == want[i].scalar_type() && got[i].sizes() == want[i].sizes() &&
                      torch::equal(got[i].contiguous(), want[i].contiguous());
    checks.check(same, "rank " + std::to_string(rank) + " tensor " + std::to_string(i) + " equals rank 0's");
  }
  checks.check(parameter_digest(got) == parameter_digest(want), "rank " + std::to_string(rank) + " digest");
}

/// Counts the bytes live from the CPU allocator and their peak since reset(), for allocations made
/// on the thread that called reset() (other tests' leftover threads allocate too).
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override {
    return count(n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override {
    return count(n);
  }
#endif
  void reset() {
    owner_ = std::this_thread::get_id();
    peak_ = live_.load();
  }
  int64_t live() const {
    return live_;
  }
  int64_t peak() const {
    return peak_;
  }

 private:
  struct Context {
    c10::DataPtr inner;
    int64_t bytes;
    const CountingAllocator* owner;
  };
  static void release(void* context) {
    auto* c = static_cast<Context*>(context);
    c->owner->live_ -= c->bytes;
    delete c;
  }
  c10::DataPtr count(size_t n) const {
    auto inner = base_->allocate(n);
    if (std::this_thread::get_id() != owner_.load()) return inner;
    void* data = inner.get();
    const auto device = inner.device();
    const int64_t now = live_ += static_cast<int64_t>(n);
    int64_t seen = peak_;
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    return {data, new Context{std::move(inner), static_cast<int64_t>(n), this}, &release, device};
  }

  c10::Allocator* base_;
  std::atomic<std::thread::id> owner_{};
  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

/// Installs a CountingAllocator as the CPU allocator for its lifetime.
class CountingScope {
 public:
  CountingScope() : previous_(c10::GetCPUAllocator()) {
    static CountingAllocator* counting = new CountingAllocator(previous_);  // outlives every tensor it made
    counting_ = counting;
    c10::SetCPUAllocator(counting_, 0);
  }
  ~CountingScope() { c10::SetCPUAllocator(previous_, 0); }
  CountingAllocator& counter() { return *counting_; }

 private:
  c10::Allocator* previous_;
  CountingAllocator* counting_ = nullptr;
};

}  // namespace

TEST_CASE("broadcast_parameters makes two ranks bit-identical in every dtype, whatever the bucket size") {
  for (const int64_t bucket : {int64_t{1}, int64_t{64}, int64_t{200}, kBroadcastBucketBytes}) {
    test::RankChecks checks;
    test::run_ranks(2, [&](ProcessGroup& group) {
      auto mine = make_tensors(group.rank());
      broadcast_parameters(mine, &group, bucket);
      check_equal(mine, make_tensors(0), checks, group.rank());
      checks.check(mine[6].stride(0) == 1, "the non-contiguous tensor keeps its layout");
    });
    INFO("bucket_bytes " << bucket);
    checks.report(2 * 12);
  }
}

TEST_CASE("broadcast_parameters keeps its temporaries within the bucket cap") {
  // 16 float32 tensors of 64 KiB, 8 bf16 of 32 KiB and one float32 of 1 MiB (over the cap)
  std::vector<at::Tensor> params;
  for (int i = 0; i < 16; ++i) params.push_back(torch::randn({16384}));
  for (int i = 0; i < 8; ++i) params.push_back(torch::randn({16384}).to(torch::kBFloat16));
  params.push_back(torch::randn({262144}));
  const int64_t cap = 256 << 10;
  int64_t model = 0;
  for (const auto& p : params) model += p.numel() * p.element_size();
  test::run_ranks(1, [&](ProcessGroup& group) {
    CountingScope scope;
    scope.counter().reset();
    const int64_t before = scope.counter().live();
    broadcast_parameters(params, &group, cap);
    const int64_t extra = scope.counter().peak() - before;
    INFO("model " << model << " bytes, peak temporaries " << extra << " bytes, cap " << cap);
    CHECK(extra <= cap);  // the 1 MiB tensor went in place; the old float64 concatenation took 2 x 2 x model
    CHECK(scope.counter().live() == before);
  });
  // and with the default cap, the whole model (under 25 MiB) is at most one copy in its own dtypes
  test::run_ranks(1, [&](ProcessGroup& group) {
    CountingScope scope;
    scope.counter().reset();
    const int64_t before = scope.counter().live();
    broadcast_parameters(params, &group);
    CHECK(scope.counter().peak() - before <= model);
  });
  CHECK_THROWS_AS(broadcast_parameters(params, nullptr, 0), hyflow::ValueError);
}

TEST_CASE("a bool sum is a logical or on gloo, a bool avg an error, and NCCL gets max for it") {
  CHECK(reduce_op_for(ReduceOp::sum, at::kBool, "x") == ReduceOp::max);
  CHECK(reduce_op_for(ReduceOp::max, at::kBool, "x") == ReduceOp::max);
  CHECK(reduce_op_for(ReduceOp::min, at::kBool, "x") == ReduceOp::min);
  CHECK(reduce_op_for(ReduceOp::product, at::kBool, "x") == ReduceOp::product);
  CHECK(reduce_op_for(ReduceOp::sum, at::kByte, "x") == ReduceOp::sum);
  CHECK(reduce_op_for(ReduceOp::avg, at::kFloat, "x") == ReduceOp::avg);
  CHECK_THROWS_WITH(reduce_op_for(ReduceOp::avg, at::kBool, "all_reduce on group 'g'"),
                    Catch::Contains("all_reduce on group 'g'") && Catch::Contains("bool"));
  test::RankChecks checks;
  test::run_ranks(3, [&](ProcessGroup& group) {
    const int r = group.rank();
    auto flags = torch::tensor({true, r == 1, false});
    group.all_reduce(flags, ReduceOp::sum);
    RANK_CHECK(checks, torch::equal(flags, torch::tensor({true, true, false})));
    // the bytes are 0 or 1: a bool sum of 3 ranks would be 3 as a byte
    RANK_CHECK(checks, flags.view(at::kByte).max().item<int>() == 1);
    auto all = torch::tensor({true, r != 2});
    group.all_reduce(all, ReduceOp::min);
    RANK_CHECK(checks, torch::equal(all, torch::tensor({true, false})));
    auto async = torch::tensor({r == 0, false});
    group.all_reduce_async(async, ReduceOp::sum)->wait();
    RANK_CHECK(checks, torch::equal(async, torch::tensor({true, false})));
    auto big = torch::tensor({r == 0, r == 1, r == 2, false, false, true});
    auto mine = torch::empty({2}, torch::kBool);
    group.reduce_scatter(mine, big, ReduceOp::sum);
    const auto want = torch::tensor({true, true, true, false, false, true}).narrow(0, 2 * r, 2);
    RANK_CHECK(checks, torch::equal(mine, want));
    checks.throws<hyflow::ValueError>([&] { group.all_reduce(flags, ReduceOp::avg); }, "bool avg", {"bool"});
  });
  checks.report(3 * 5);
}
