#pragma once
// Small worker classes shared by the runtime tests.

#include <hyflow/actors/all.hpp>
#ifdef HYFLOW_TEST_WORKERS_PARALLEL  // builds with parallel/: a collective inside a method
#include <hyflow/parallel/process_group.hpp>
#endif

#include <torch/torch.h>

#include <chrono>
#include <thread>

namespace test {

using hyflow::DataProto;
using hyflow::Json;

inline DataProto make_batch(int64_t rows, int64_t cols = 3) {
  auto x = torch::arange(rows * cols, torch::kFloat32).reshape({rows, cols});
  return DataProto(hyflow::TensorDict{{"x", x}});
}

/// Every dispatch mode on one class. Adds its rank to each row so tests can see placement.
class EchoWorker : public hyflow::Worker {
 public:
  explicit EchoWorker(const Json& args) : offset_(args.value("offset", 0)) {
    if (args.value("fail_on_rank", -1) == rank()) throw hyflow::ValueError("refusing to start on this rank");
  }

  // DP_COMPUTE_PROTO: x * 2, plus a "rank" column.
  DataProto double_x(DataProto batch) {
    DataProto out(hyflow::TensorDict{{"x", batch.batch.at("x") * 2},
                                     {"rank", torch::full({batch.size()}, rank(), torch::kInt64)}});
    out.meta_info = batch.meta_info;
    return out;
  }
  DataProto nd_double_x(DataProto batch) { return double_x(std::move(batch)); }
  DataProto nd_double_x_async(DataProto batch) { return double_x(std::move(batch)); }
  // materialize_futures = false: the future itself arrives.
  int64_t future_rows(hyflow::DataProtoFuture f) { return f.get().size(); }
  // ONE_TO_ALL / ALL_TO_ALL / DP_COMPUTE: plain values.
  int add_rank(int x) { return x + rank() + offset_; }
  std::string whoami() const { return "rank " + std::to_string(rank()) + "/" + std::to_string(world_size()); }
  // DP_COMPUTE_METRIC: one metrics object per rank.
  Json metrics(DataProto batch) { return Json{{"rows", batch.size()}, {"rank", rank()}}; }
  // Execute RANK_ZERO.
  int only_rank_zero(int x) { return x * 100 + rank(); }
  void set_state(int v) { state_ = v; }
  int get_state() const { return state_; }
  int throw_on_rank(int r) {
    if (rank() == r) throw hyflow::KeyError("missing key 'values' on purpose");
    return rank();
  }
  int sleep_on_rank(int r, int ms) {
    if (rank() == r) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return rank();
  }
  int sleep_async(int r, int ms) { return sleep_on_rank(r, ms); }
  int crash_on_rank(int r, int ms) {
    if (rank() == r) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      exit_worker("simulated crash");
    }
    return rank();
  }
  // Non-blocking DP method for future chaining; materialize_futures=true.
  DataProto plus_one(DataProto batch) {
    DataProto out(hyflow::TensorDict{{"x", batch.batch.at("x") + 1}});
    out.meta_info = batch.meta_info;
    return out;
  }
  DataProto generate(DataProto batch) { return batch; }
  int throw_async(int r) { return throw_on_rank(r); }
#ifdef HYFLOW_TEST_WORKERS_PARALLEL
  // Collective inside a method, over the group kept by the worker's host.
  double all_reduce_rank() {
    auto& pg = *host().get_or_create<hyflow::parallel::ProcessGroup>([this] {
      return std::make_shared<hyflow::parallel::ProcessGroup>(hyflow::parallel::ProcessGroupOptions{
          .rank = rank(), .world_size = world_size(), .master_addr = master_addr(), .master_port = master_port(),
          .store_token = env().store_token, .node = env().node});
    });
    auto t = torch::full({2}, double(rank() + 1), torch::kFloat64);
    pg.all_reduce(t);
    return t[0].item<double>();
  }
#endif
  // Zero-copy check: the address of the first element of "x" on the worker.
  int64_t data_address(DataProto batch) {
    return static_cast<int64_t>(reinterpret_cast<intptr_t>(batch.batch.at("x").data_ptr()));
  }
  void noop() {}
  DataProto identity(DataProto batch) { return batch; }
  void register_mesh(const std::string& mesh, int dp_size) {
    // ranks r -> dp rank r / (world/dp); only the first rank of each dp group collects.
    const int per = world_size() / dp_size;
    register_dispatch_collect_info(mesh, rank() / per, rank() % per == 0);
  }

  static void define_methods(hyflow::MethodTable<EchoWorker>& t) {
    using namespace hyflow;
    using namespace hyflow::actors;
    t.add("double_x", &EchoWorker::double_x, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
    t.add("throw_async", &EchoWorker::throw_async, {.dispatch = Dispatch::ONE_TO_ALL, .blocking = false});
    t.add("add_rank", &EchoWorker::add_rank, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("add_rank_all", &EchoWorker::add_rank, {.dispatch = Dispatch::ALL_TO_ALL});  // same member, by name
    t.add("add_rank_dp", &EchoWorker::add_rank, {.dispatch = Dispatch::DP_COMPUTE});
    t.add("add_rank_zero", &EchoWorker::add_rank, {.dispatch = Dispatch::RANK_ZERO});
    t.add("whoami", &EchoWorker::whoami, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("metrics", &EchoWorker::metrics, {.dispatch = Dispatch::DP_COMPUTE_METRIC});
    t.add("only_rank_zero", &EchoWorker::only_rank_zero,
          {.dispatch = Dispatch::ALL_TO_ALL, .execute = Execute::RANK_ZERO});
    t.add("set_state", &EchoWorker::set_state, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("get_state", &EchoWorker::get_state, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("throw_on_rank", &EchoWorker::throw_on_rank, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("sleep_on_rank", &EchoWorker::sleep_on_rank, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("sleep_async", &EchoWorker::sleep_async, {.dispatch = Dispatch::ONE_TO_ALL, .blocking = false});
    t.add("crash_on_rank", &EchoWorker::crash_on_rank, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("plus_one", &EchoWorker::plus_one, {.dispatch = Dispatch::DP_COMPUTE_PROTO, .blocking = false});
#ifdef HYFLOW_TEST_WORKERS_PARALLEL
    t.add("all_reduce_rank", &EchoWorker::all_reduce_rank, {.dispatch = Dispatch::ONE_TO_ALL});
#endif
    t.add("data_address", &EchoWorker::data_address, {.dispatch = Dispatch::DP_COMPUTE_METRIC});
    t.add("noop", &EchoWorker::noop, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("identity", &EchoWorker::identity, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
    t.add("register_mesh", &EchoWorker::register_mesh, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("nd_double_x", &EchoWorker::nd_double_x,
          {.inline_dispatch = hyflow::make_nd_compute_dataproto_dispatch_fn("train")});
    t.add("nd_double_x_async", &EchoWorker::nd_double_x_async,
          {.blocking = false, .inline_dispatch = hyflow::make_nd_compute_dataproto_dispatch_fn("train")});
    t.add("future_rows", &EchoWorker::future_rows, {.dispatch = Dispatch::ONE_TO_ALL, .materialize_futures = false});
    t.add("generate", &EchoWorker::generate, {.dispatch = Dispatch::DIRECT_ROLLOUT_METHOD});
  }

 private:
  int offset_ = 0;
  int state_ = 0;
};

/// Roles for colocation tests: each keeps its own counter.
class CounterRole : public hyflow::Worker {
 public:
  explicit CounterRole(const Json& args) : step_(args.value("step", 1)) {}
  int bump() { return counter_ += step_; }
  int value() const { return counter_; }
  std::string device_and_rank() const { return device() + "#" + std::to_string(rank()); }
  static void define_methods(hyflow::MethodTable<CounterRole>& t) {
    using namespace hyflow;
    using namespace hyflow::actors;
    t.add("bump", &CounterRole::bump, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("value", &CounterRole::value, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("device_and_rank", &CounterRole::device_and_rank, {.dispatch = Dispatch::ONE_TO_ALL});
  }

 private:
  int step_;
  int counter_ = 0;
};

class ScaleRole : public hyflow::Worker {
 public:
  explicit ScaleRole(const Json& args) : factor_(args.value("factor", 1.0)) {}
  DataProto scale(DataProto batch) { return DataProto(hyflow::TensorDict{{"x", batch.batch.at("x") * factor_}}); }
  double factor() const { return factor_; }
  static void define_methods(hyflow::MethodTable<ScaleRole>& t) {
    t.add("scale", &ScaleRole::scale, {.dispatch = hyflow::Dispatch::DP_COMPUTE_PROTO});
    t.add("factor", &ScaleRole::factor, {.dispatch = hyflow::Dispatch::RANK_ZERO});
  }

 private:
  double factor_;
};

inline void register_test_workers() {
  hyflow::register_worker_type<EchoWorker>("EchoWorker");
  hyflow::register_worker_type<CounterRole>("CounterRole");
  hyflow::register_worker_type<ScaleRole>("ScaleRole");
}

}  // namespace test
