// SerialExecutor and the off-policy metrics of the asynchronous trainer (docs/trainer.md).
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/async_rollout.hpp>

#include <torch/torch.h>

namespace hyflow::trainer {

SerialExecutor::SerialExecutor() : thread_([this] { run(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    tasks_.clear();
  }
  wake_.notify_all();
  thread_.join();
}

void SerialExecutor::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  wake_.notify_all();
}

void SerialExecutor::drain() {
  std::unique_lock lock(mutex_);
  tasks_.clear();
  idle_.wait(lock, [&] { return !busy_; });
}

std::exception_ptr SerialExecutor::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void SerialExecutor::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (stop_) return;
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !failure_) failure_ = error;
    busy_ = false;
    idle_.notify_all();
  }
}

namespace {
void add_stats(nlohmann::json& m, const std::string& name, const at::Tensor& values) {
  const auto v = values.to(torch::kDouble);
  m[name + "/mean"] = v.mean().item<double>();
  m[name + "/max"] = v.max().item<double>();
  m[name + "/min"] = v.min().item<double>();
}
}  // namespace

nlohmann::json off_policy_metrics(const DataProto& batch, int64_t trained_version) {
  for (const char* key : {"min_weight_version", "max_weight_version"})
    if (!batch.batch.contains(key))
      throw KeyError(std::string("off-policy metrics: the batch lacks '") + key +
                     "' (rows from a rollout group that never received versioned weights)");
  if (batch.size() == 0) throw ValueError("off-policy metrics: the batch is empty");
  const at::Tensor lo = batch.batch.at("min_weight_version"), hi = batch.batch.at("max_weight_version");
  nlohmann::json m = nlohmann::json::object();
  add_stats(m, "training/off_policy/trajectory_spans", hi - lo + 1);
  add_stats(m, "training/off_policy/trajectory_staleness", trained_version - hi);
  add_stats(m, "training/off_policy/trajectory_staleness_worst", trained_version - lo);
  return m;
}

}  // namespace hyflow::trainer
