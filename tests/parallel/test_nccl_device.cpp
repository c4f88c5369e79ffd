// The NCCL communicator on real devices: one rank per visible GPU (at most 4), ranks as
// threads sharing a MemoryStore. Without a CUDA device it prints why and exits 77, which CTest
// reports as "Not Run (Skipped)".

#include "nccl/nccl_communicator.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/parallel/watchdog.hpp>

#include <cuda_runtime.h>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>
#include <thread>
#include <vector>

using namespace hyflow::parallel;
using detail::NcclCommunicator;
using detail::NcclOp;
using detail::NcclType;

namespace {

int devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

struct DeviceFloats {
  float* p = nullptr;
  size_t n;
  explicit DeviceFloats(const std::vector<float>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p); }
  std::vector<float> read() const {
    std::vector<float> out(n);
    cudaDeviceSynchronize();
    cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return out;
  }
};

template <class Fn>
void run_ranks(int world, Fn fn) {
  MemoryStore store;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        cudaSetDevice(r);
        NcclCommunicator comm(store, "test", r, world, r, std::chrono::seconds(60));
        fn(comm, r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

TEST_CASE("NCCL all_reduce, all_gather, reduce_scatter and broadcast across the visible GPUs") {
  const int world = std::min(devices(), 4);
  std::vector<std::vector<float>> reduced(static_cast<size_t>(world)), gathered(reduced), scattered(reduced),
      cast(reduced), averaged(reduced);
  run_ranks(world, [&](NcclCommunicator& comm, int r) {
    const auto rr = static_cast<size_t>(r);
    DeviceFloats a({float(r + 1), float(2 * (r + 1))});
    comm.all_reduce(a.p, a.p, 2, NcclType::f32, NcclOp::sum, nullptr);
    reduced[rr] = a.read();
    DeviceFloats mean({float(r)});
    comm.all_reduce(mean.p, mean.p, 1, NcclType::f32, NcclOp::avg, nullptr);
    averaged[rr] = mean.read();
    DeviceFloats mine({float(r)}), all(std::vector<float>(static_cast<size_t>(world), -1.f));
    comm.all_gather(mine.p, all.p, 1, NcclType::f32, nullptr);
    gathered[rr] = all.read();
    std::vector<float> blocks(static_cast<size_t>(world));
    for (int i = 0; i < world; ++i) blocks[static_cast<size_t>(i)] = float(i * 10 + r);
    DeviceFloats in(blocks), out({0.f});
    comm.reduce_scatter(in.p, out.p, 1, NcclType::f32, NcclOp::sum, nullptr);
    scattered[rr] = out.read();
    DeviceFloats b({r == 0 ? 42.f : 0.f});
    comm.broadcast(b.p, 1, NcclType::f32, 0, nullptr);
    cast[rr] = b.read();
    comm.barrier(nullptr);
    comm.synchronize();
  });
  const float n = float(world), tri = n * (n + 1) / 2;
  for (int r = 0; r < world; ++r) {
    const auto rr = static_cast<size_t>(r);
    CHECK(reduced[rr] == std::vector<float>{tri, 2 * tri});
    CHECK(averaged[rr][0] == Approx((n - 1) / 2));
    for (int i = 0; i < world; ++i) CHECK(gathered[rr][static_cast<size_t>(i)] == float(i));
    CHECK(scattered[rr][0] == float(r * 10 * world) + (n - 1) * n / 2);
    CHECK(cast[rr][0] == 42.f);
  }
}

TEST_CASE("a rank that never joins is named by the rendezvous") {
  MemoryStore store;  // rank 1 of 2 never comes
  CHECK_THROWS_WITH(NcclCommunicator(store, "lonely", 0, 2, 0, std::chrono::milliseconds(300)),
                    Catch::Contains("ranks that never arrived: 1"));
}

TEST_CASE("a communicator without a device is refused before any CUDA call, naming the group and rank") {
  MemoryStore store;
  CHECK_THROWS_AS(NcclCommunicator(store, "actor", 1, 2, -1, std::chrono::milliseconds(300)), hyflow::ValueError);
  CHECK_THROWS_WITH(NcclCommunicator(store, "actor", 1, 2, -1, std::chrono::milliseconds(300)),
                    Catch::Contains("NCCL group 'actor' rank 1 of 2") && Catch::Contains("no CUDA device given"));
}

int main(int argc, char* argv[]) {
  if (devices() == 0) {
    std::cout << "SKIPPED: no CUDA device visible; the NCCL communicator was built but not run\n";
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
