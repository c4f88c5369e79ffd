#pragma once
// ClusterBenchWorker: the worker bench/cluster places on a caf-node (registered by
// bench_workers.cpp, which is linked into the bench and into caf-node).

#include <hyflow/actors/all.hpp>

#include <cstdint>

namespace hyflow::bench {

class ClusterBenchWorker : public Worker {
 public:
  /// The no-op whose round trip is the call latency.
  void noop() {}
  /// Controller -> worker: takes a batch, answers with its tensor bytes (a small reply).
  int64_t nbytes(DataProto batch);
  /// Worker -> controller: a float32 batch of `bytes` bytes (made once per size, then reused).
  DataProto make(int64_t bytes);
  static void define_methods(MethodTable<ClusterBenchWorker>& t);

 private:
  DataProto cached_;
};

}  // namespace hyflow::bench
