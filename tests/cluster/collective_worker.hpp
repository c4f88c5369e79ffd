#pragma once
// A worker for the cluster's failure tests: ranks that wait inside a gloo collective while
// another rank (on another node) is killed or stopped before it joins. Hosted by
// hyflow-test-node (compiled into it with HYFLOW_TEST_NODE) and registered by the tests.

#include <hyflow/actors/all.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace test {

class CollectiveWorker : public hyflow::Worker {
 public:
  explicit CollectiveWorker(const hyflow::Json&) {}
  /// Sets up the process group (every rank must call it once).
  int join() {
    group();
    return rank();
  }
  /// Rank `late` sleeps `ms` first; the others enter the all-reduce at once and wait there.
  double late_all_reduce(int late, int ms) {
    if (rank() == late) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    auto t = torch::full({1}, double(rank() + 1), torch::kFloat64);
    group().all_reduce(t);
    return t[0].item<double>();
  }
  /// late_all_reduce that writes how it ended to "<dir>/rank<r>" (the survivors' side of a
  /// peer's death, which the controller no longer waits for).
  double late_all_reduce_reported(int late, int ms, const std::string& dir) {
    const auto path = dir + "/rank" + std::to_string(rank());
    try {
      const double sum = late_all_reduce(late, ms);
      std::ofstream(path) << "sum " << sum;
      return sum;
    } catch (const std::exception& e) {
      std::ofstream(path) << "error " << e.what();
      throw;
    }
  }
  static void define_methods(hyflow::MethodTable<CollectiveWorker>& t) {
    t.add("join", &CollectiveWorker::join, {.dispatch = hyflow::Dispatch::ONE_TO_ALL});
    t.add("late_all_reduce", &CollectiveWorker::late_all_reduce, {.dispatch = hyflow::Dispatch::ONE_TO_ALL});
    t.add("late_all_reduce_reported", &CollectiveWorker::late_all_reduce_reported,
          {.dispatch = hyflow::Dispatch::ONE_TO_ALL});
  }

 private:
  hyflow::parallel::ProcessGroup& group() {
    return *host().get_or_create<hyflow::parallel::ProcessGroup>([this] {
      return std::make_shared<hyflow::parallel::ProcessGroup>(hyflow::parallel::ProcessGroupOptions{
          .rank = rank(), .world_size = world_size(), .master_addr = master_addr(), .master_port = master_port(),
          .store_token = env().store_token, .node = env().node});
    });
  }
};

inline void register_collective_worker() {
  hyflow::register_worker_type<CollectiveWorker>("CollectiveWorker");
}

}  // namespace test
