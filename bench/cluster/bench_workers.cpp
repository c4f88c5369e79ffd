// The worker type bench/cluster places on a caf-node. This file is compiled into both the bench
// and caf-node (bench/cluster/CMakeLists.txt adds it to caf-node when benchmarks are built), and
// registers itself at start-up, so that both ends know the type and its method table.
#include "bench_workers.hpp"

#include <torch/torch.h>

namespace hyflow::bench {

int64_t ClusterBenchWorker::nbytes(DataProto batch) {
  int64_t n = 0;
  for (const auto& [key, t] : batch.batch) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

DataProto ClusterBenchWorker::make(int64_t bytes) {
  if (bytes <= 0 || bytes % 4 != 0)
    throw ValueError("make: bytes must be a positive multiple of 4, got " + std::to_string(bytes));
  // Made once per size: the figure is the transfer, not the allocation.
  if (!cached_.batch.contains("x") || nbytes(cached_) != bytes) {
    const int64_t floats = bytes / 4;
    const int64_t rows = floats % 16 == 0 ? 16 : 1;
    cached_ = DataProto(TensorDict{{"x", torch::rand({rows, floats / rows})}});
  }
  return cached_;
}

void ClusterBenchWorker::define_methods(MethodTable<ClusterBenchWorker>& t) {
  t.add("noop", &ClusterBenchWorker::noop, {.dispatch = Dispatch::ONE_TO_ALL});
  t.add("nbytes", &ClusterBenchWorker::nbytes, {.dispatch = Dispatch::DP_COMPUTE_METRIC});
  t.add("make", &ClusterBenchWorker::make, {.dispatch = Dispatch::RANK_ZERO});
}

HYFLOW_REGISTER_WORKER(ClusterBenchWorker, "ClusterBenchWorker");

}  // namespace hyflow::bench
