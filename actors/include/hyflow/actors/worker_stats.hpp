#pragma once
// WorkerStats: process-wide counts of the worker actors this process hosts and the method
// calls they run, kept in relaxed atomics by the worker actor (src/worker_actor.cpp) so that
// counting costs a few atomic adds per call and no lock. caf-node exports them as Prometheus
// series (hyflow/cluster/node_metrics.hpp).

#include <atomic>
#include <cstdint>

namespace hyflow::actors {

struct WorkerStats {
  std::atomic<int64_t> alive{0};            ///< worker actors spawned and not yet ended
  std::atomic<int64_t> calls_in_flight{0};  ///< methods running now
  std::atomic<uint64_t> calls_ok{0};        ///< methods that returned a result
  std::atomic<uint64_t> calls_failed{0};    ///< methods that threw (or found the worker uninitialized)
};

/// This process' counts (never destroyed: worker actors may end while statics are destroyed).
WorkerStats& worker_stats();

}  // namespace hyflow::actors
