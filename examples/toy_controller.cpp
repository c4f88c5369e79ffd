// A toy single controller: a "critic" worker class scores rows and learns a bias; the
// controller drives four workers with ordinary-looking calls.
#include <hyflow/actors/all.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <torch/torch.h>

#include <iostream>

using hyflow::DataProto;
using hyflow::Json;

/// Each worker holds a bias; values = mean(x) + bias; an update moves the bias toward the
/// returns and reports the loss.
class ToyCritic : public hyflow::Worker {
 public:
  explicit ToyCritic(const Json& config) : lr_(config.value("lr", 0.5)) {}

  DataProto compute_values(DataProto batch) {
    auto values = batch.batch.at("x").mean(1) + bias_;
    return DataProto(hyflow::TensorDict{{"values", values}});
  }

  Json update_critic(DataProto batch) {
    auto err = batch.batch.at("returns") - (batch.batch.at("x").mean(1) + bias_);
    const double loss = err.pow(2).mean().item<double>();
    // All ranks agree on one step: average the gradient over the group (gloo all-reduce).
    auto grad = err.mean().reshape({1}).to(torch::kFloat64);
    process_group().all_reduce(grad, hyflow::parallel::ReduceOp::avg);
    bias_ += lr_ * grad.item<double>();
    return Json{{"critic/loss", loss}, {"critic/bias", bias_}, {"rank", rank()}};
  }

  // The gloo group of this worker group, kept by the worker's host (shared with any role
  // colocated in the same worker); creating it is a rendezvous of every rank.
  hyflow::parallel::ProcessGroup& process_group() {
    return *host().get_or_create<hyflow::parallel::ProcessGroup>([this] {
      return std::make_shared<hyflow::parallel::ProcessGroup>(hyflow::parallel::ProcessGroupOptions{
          .rank = rank(), .world_size = world_size(), .master_addr = master_addr(), .master_port = master_port(),
          .store_token = env().store_token, .node = env().node});
    });
  }

  static void define_methods(hyflow::MethodTable<ToyCritic>& t) {
    t.add("compute_values", &ToyCritic::compute_values, {.dispatch = hyflow::Dispatch::DP_COMPUTE_PROTO});
    t.add("update_critic", &ToyCritic::update_critic, {.dispatch = hyflow::Dispatch::DP_COMPUTE_METRIC});
  }

 private:
  double lr_;
  double bias_ = 0.0;
};
HYFLOW_REGISTER_WORKER(ToyCritic, "ToyCritic");

int main() {
  hyflow::Runtime runtime;
  hyflow::WorkerGroup critic(runtime, hyflow::ResourcePool({4}), {"ToyCritic", {{"lr", 0.5}}});

  // 10 rows do not split into 4: auto-padding pads to 12 and the result is un-padded.
  auto x = torch::arange(30, torch::kFloat32).reshape({10, 3});
  DataProto batch(hyflow::TensorDict{{"x", x}, {"returns", x.mean(1) + 2.0}});
  batch.meta_info[hyflow::kAutoPaddingKey] = true;

  for (int step = 0; step < 8; ++step) {
    std::vector<Json> metrics = critic.call(&ToyCritic::update_critic, batch);
    std::cout << "step " << step << " loss " << metrics[0]["critic/loss"] << " bias " << metrics[0]["critic/bias"]
              << "\n";
  }
  DataProto values = critic.call(&ToyCritic::compute_values, batch);
  const double gap = (values.batch.at("values") - batch.batch.at("returns")).abs().max().item<double>();
  std::cout << "values for " << values.size() << " rows, max |value - return| = " << gap << "\n";
  if (values.size() != 10 || gap > 0.05) {
    std::cerr << "toy critic did not learn the bias\n";
    return 1;
  }
  return 0;
}
