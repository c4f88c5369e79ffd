// Runtime figures (JSON lines, design brief §5):
//  - no-op call latency through a WorkerGroup of 8 in-process workers, against the bare cost of
//    waking 8 threads and collecting their answers (std::condition_variable round trip);
//  - DP_COMPUTE_PROTO dispatch + collect of a 256x4096 float32 DataProto across 8 workers,
//    against one memcpy of the same bytes.
#include "bench_json.hpp"

#include <hyflow/actors/all.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <thread>

using namespace hyflow;
using namespace hyflow::actors;
using Clock = std::chrono::steady_clock;

namespace {

class BenchWorker : public Worker {
 public:
  void noop() {}
  DataProto identity(DataProto batch) { return batch; }
  DataProto fresh(DataProto batch) { return DataProto(TensorDict{{"x", batch.batch.at("x").clone()}}); }
  static void define_methods(MethodTable<BenchWorker>& t) {
    t.add("noop", &BenchWorker::noop, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("identity", &BenchWorker::identity, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
    t.add("fresh", &BenchWorker::fresh, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
  }
};

/// The peer for call latency: N threads that wait for a ticket and answer it.
class ThreadPingPong {
 public:
  explicit ThreadPingPong(int n) {
    for (int i = 0; i < n; ++i)
      threads_.emplace_back([this] {
        uint64_t seen = 0;
        for (;;) {
          std::unique_lock lock(m_);
          cv_.wait(lock, [&] { return stop_ || ticket_ != seen; });
          if (stop_) return;
          seen = ticket_;
          if (++answers_ == threads_.size()) done_.notify_one();
        }
      });
  }
  ~ThreadPingPong() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void round() {
    std::unique_lock lock(m_);
    answers_ = 0;
    ++ticket_;
    cv_.notify_all();
    done_.wait(lock, [&] { return answers_ == threads_.size(); });
  }

 private:
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_, done_;
  uint64_t ticket_ = 0;
  size_t answers_ = 0;
  bool stop_ = false;
};

template <class F>
double median_us(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

using hyflow_bench::emit;

}  // namespace

int main() {
  register_worker_type<BenchWorker>("BenchWorker");
  Runtime runtime;
  WorkerGroup wg(runtime, ResourcePool({8}), WorkerSpec{"BenchWorker", Json::object()});

  // --- no-op latency -------------------------------------------------------------------------
  for (int i = 0; i < 200; ++i) wg.call("noop");
  const double ours = median_us(3000, [&] { wg.call("noop"); });
  double peer;
  {
    ThreadPingPong pp(8);
    for (int i = 0; i < 200; ++i) pp.round();
    peer = median_us(3000, [&] { pp.round(); });
  }
  emit("actors_call_latency", "no-op ONE_TO_ALL, 8 workers (median)", ours, "us",
       "condvar wake of 8 threads + answers", peer, peer / ours);

  // --- DP_COMPUTE_PROTO data path ---------------------------------------------------------------
  const int64_t rows = 256, cols = 4096;
  DataProto batch(TensorDict{{"x", torch::randn({rows, cols})}});
  const double bytes = double(rows * cols * sizeof(float));
  for (int i = 0; i < 10; ++i) wg.call("identity", batch);
  const double call_us = median_us(50, [&] { wg.call("identity", batch); });
  const auto timing = wg.last_timing();
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes));
  const double copy_us = median_us(50, [&] {
    std::memcpy(dst.data(), src.data(), src.size());
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
  const double ours_mbs = bytes / call_us;  // bytes/us == MB/s
  const double copy_mbs = bytes / copy_us;
  emit("actors_dp_compute_proto", "256x4096 f32 dispatch+collect, 8 workers, pass-through (median)", ours_mbs,
       "MB/s", "memcpy of the same 4 MiB", copy_mbs, ours_mbs / copy_mbs);
  // Workers that allocate their outputs: 8 parallel clones, then concat copies once.
  for (int i = 0; i < 10; ++i) wg.call("fresh", batch);
  const double fresh_us = median_us(50, [&] { wg.call("fresh", batch); });
  emit("actors_dp_compute_proto", "256x4096 f32 dispatch+collect, 8 workers, new outputs (median)", bytes / fresh_us,
       "MB/s", "memcpy of the same 4 MiB", copy_mbs, (bytes / fresh_us) / copy_mbs);
  std::cerr << "last call: dispatch " << timing.dispatch_us << " us, execute " << timing.execute_us << " us, collect "
            << timing.collect_us << " us, total " << timing.total_us << " us\n";
  return 0;
}
