#include <hyflow/core/error.hpp>
#include <hyflow/parallel/data_parallel.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

namespace hyflow::parallel {

namespace {
struct Bucket {
  std::vector<at::Tensor> tensors;
  int64_t numel = 0;
  int64_t bytes = 0;
  bool in_place() const { return tensors.size() == 1 && tensors.front().is_contiguous(); }
};
}  // namespace

void broadcast_parameters(const std::vector<at::Tensor>& parameters, ProcessGroup* group, int64_t bucket_bytes) {
  if (bucket_bytes <= 0) {
    throw ValueError("broadcast_parameters: bucket_bytes must be > 0, got " + std::to_string(bucket_bytes));
  }
  if (!group || parameters.empty()) return;
  torch::NoGradGuard no_grad;
  // (dtype, device) groups in the order they first appear, so every rank walks the same buckets
  std::vector<std::pair<std::pair<at::ScalarType, at::Device>, std::vector<at::Tensor>>> groups;
  for (const auto& p : parameters) {
    if (p.numel() == 0) continue;
    const std::pair key{p.scalar_type(), p.device()};
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {}});
      it = std::prev(groups.end());
    }
    it->second.push_back(p);
  }
  std::vector<Bucket> buckets;
  for (const auto& [key, tensors] : groups) {
    const int64_t element = static_cast<int64_t>(c10::elementSize(key.first));
    Bucket bucket;
    for (const auto& p : tensors) {
      if (!bucket.tensors.empty() && (bucket.numel + p.numel()) * element > bucket_bytes) {
        buckets.push_back(std::move(bucket));
        bucket = {};
      }
      bucket.tensors.push_back(p.detach());
      bucket.numel += p.numel();
      bucket.bytes = bucket.numel * element;
    }
    if (!bucket.tensors.empty()) buckets.push_back(std::move(bucket));
  }
  // One staging buffer per device, as large as the largest packed bucket and reused by every
  // bucket (viewed in its dtype): a bucket's buffer that the backend releases late (gloo's work
  // holds it) cannot add to the next one's.
  std::vector<std::pair<at::Device, at::Tensor>> staging;
  auto staging_of = [&](const at::Device& device) {
    auto it = std::find_if(staging.begin(), staging.end(), [&](const auto& s) { return s.first == device; });
    if (it != staging.end()) return it->second;
    int64_t largest = 0;
    for (const auto& b : buckets)
      if (!b.in_place() && b.tensors.front().device() == device) largest = std::max(largest, b.bytes);
    staging.push_back({device, at::empty({largest}, at::TensorOptions().dtype(at::kByte).device(device))});
    return staging.back().second;
  };
  for (auto& b : buckets) {
    auto& first = b.tensors.front();
    if (b.in_place()) {
      group->broadcast(first, 0);  // no temporary at all
      continue;
    }
    auto flat = staging_of(first.device()).narrow(0, 0, b.bytes).view(first.scalar_type());
    int64_t offset = 0;
    for (const auto& p : b.tensors) {
      flat.narrow(0, offset, p.numel()).view(p.sizes()).copy_(p);
      offset += p.numel();
    }
    group->broadcast(flat, 0);
    offset = 0;
    for (auto& p : b.tensors) {
      p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
}

std::string parameter_digest(const std::vector<at::Tensor>& parameters) {
  uint64_t hash = 1469598103934665603ull;
  for (const auto& p : parameters) {
    auto bytes = p.detach().cpu().contiguous();
    const auto* data = static_cast<const unsigned char*>(bytes.data_ptr());
    const size_t n = static_cast<size_t>(bytes.numel()) * bytes.element_size();
    for (size_t i = 0; i < n; ++i) {
      hash ^= data[i];
      hash *= 1099511628211ull;
    }
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

DataParallelOptimizer::DataParallelOptimizer(std::vector<at::Tensor> parameters, const OptimConfig& config,
                                             std::shared_ptr<ProcessGroup> group, const std::string& path)
    : parameters_(std::move(parameters)), config_(config), group_(std::move(group)) {
  schedule_ = algos::core_algos::get_lr_schedule(
      {.type = config_.lr_scheduler_type,
       .num_warmup_steps = config_.resolved_warmup_steps(path + ".lr_warmup_steps_ratio"),
       .num_training_steps = config_.total_training_steps,
       .min_lr_ratio = config_.min_lr_ratio,
       .num_cycles = config_.num_cycles},
      path + ".lr_scheduler_type");
  optimizer_ = std::make_unique<torch::optim::AdamW>(
      parameters_, torch::optim::AdamWOptions(config_.lr)
                       .betas({config_.betas[0], config_.betas[1]})
                       .eps(config_.eps)
                       .weight_decay(config_.weight_decay));
  reset_schedule(0);
}

DataParallelOptimizer::~DataParallelOptimizer() = default;

void DataParallelOptimizer::reset_schedule(int64_t steps) {
  scheduler_.reset();
  for (auto& g : optimizer_->param_groups()) g.options().set_lr(config_.lr);
  scheduler_ = std::make_unique<algos::core_algos::LambdaLR>(*optimizer_, schedule_);
  for (int64_t i = 0; i < steps; ++i) scheduler_->step();
  scheduler_steps_ = steps;
}

void DataParallelOptimizer::zero_grad() {
  for (auto& p : parameters_)
    if (p.grad().defined()) p.mutable_grad().zero_();
}

double DataParallelOptimizer::step(double max_norm) {
  torch::NoGradGuard no_grad;
  for (auto& p : parameters_)
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  if (group_) {
    // one flat buffer, one collective
    std::vector<at::Tensor> flat;
    flat.reserve(parameters_.size());
    for (auto& p : parameters_) flat.push_back(p.grad().reshape({-1}));
    auto buffer = torch::cat(flat);
    group_->all_reduce(buffer, ReduceOp::avg);
    int64_t offset = 0;
    for (auto& p : parameters_) {
      const int64_t n = p.numel();
      p.mutable_grad().copy_(buffer.narrow(0, offset, n).view_as(p));
      offset += n;
    }
  }
  const double norm = torch::nn::utils::clip_grad_norm_(parameters_, max_norm);
  if (std::isfinite(norm)) {
    optimizer_->step();
  } else {
    zero_grad();
  }
  return norm;
}

std::vector<at::Tensor> DataParallelOptimizer::state_tensors() const {
  std::vector<at::Tensor> out;
  for (const auto& [key, state] : optimizer_->state()) {
    const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*state);
    for (const auto& t : {adam.exp_avg(), adam.exp_avg_sq(), adam.max_exp_avg_sq()})
      if (t.defined()) out.push_back(t);
  }
  return out;
}

double DataParallelOptimizer::lr() const { return scheduler_->get_last_lr().front(); }

void DataParallelOptimizer::scheduler_step() {
  scheduler_->step();
  ++scheduler_steps_;
}

void DataParallelOptimizer::save(const std::filesystem::path& file) const {
  torch::serialize::OutputArchive archive;
  optimizer_->save(archive);
  archive.write("scheduler_steps", torch::tensor(scheduler_steps_, torch::kLong));
  archive.save_to(file.string());
}

void DataParallelOptimizer::load(const std::filesystem::path& file) {
  if (!std::filesystem::is_regular_file(file))
    throw FormatError("optimizer checkpoint '" + file.string() + "' does not exist");
  torch::serialize::InputArchive archive;
  at::Tensor steps;
  try {
    archive.load_from(file.string());
    optimizer_->load(archive);
    archive.read("scheduler_steps", steps);
  } catch (const c10::Error& e) {
    throw FormatError("optimizer checkpoint '" + file.string() + "' cannot be loaded: " + e.what_without_backtrace());
  }
  reset_schedule(steps.item<int64_t>());
}

std::vector<AdamState> DataParallelOptimizer::adam_state() const {
  std::vector<AdamState> out;
  out.reserve(parameters_.size());
  const auto& state = optimizer_->state();
  for (const auto& p : parameters_) {
    auto it = state.find(c10::guts::to_string(p.unsafeGetTensorImpl()));
    if (it == state.end()) {
      out.push_back({});
      continue;
    }
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out.push_back({s.exp_avg(), s.exp_avg_sq(), s.step()});
  }
  return out;
}

void DataParallelOptimizer::set_adam_state(const std::vector<AdamState>& state, int64_t scheduler_steps,
                                           const std::string& source) {
  if (state.size() != parameters_.size())
    throw ShapeError(source + ": optimizer state for " + std::to_string(state.size()) + " parameters, the model has " +
                     std::to_string(parameters_.size()));
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& s = state[i];
    if (s.exp_avg.defined() != s.exp_avg_sq.defined())
      throw ShapeError(source + ": parameter " + std::to_string(i) + " has only one of exp_avg and exp_avg_sq");
    for (const auto* t : {&s.exp_avg, &s.exp_avg_sq})
      if (t->defined() && t->sizes() != parameters_[i].sizes())
        throw ShapeError(source + ": optimizer state of parameter " + std::to_string(i) + " has shape " +
                         c10::str(t->sizes()) + ", the parameter " + c10::str(parameters_[i].sizes()));
  }
  torch::NoGradGuard no_grad;
  auto& map = optimizer_->state();
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& p = parameters_[i];
    const auto key = c10::guts::to_string(p.unsafeGetTensorImpl());
    if (!state[i].exp_avg.defined()) {
      map.erase(key);
      continue;
    }
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(state[i].step);
    s->exp_avg(state[i].exp_avg.to(p.device(), p.scalar_type()).clone(at::MemoryFormat::Contiguous));
    s->exp_avg_sq(state[i].exp_avg_sq.to(p.device(), p.scalar_type()).clone(at::MemoryFormat::Contiguous));
    map[key] = std::move(s);
  }
  reset_schedule(scheduler_steps);
}

void save_rng_state(const std::filesystem::path& file, const at::Generator* extra) {
  torch::serialize::OutputArchive archive;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(gen.mutex());
    archive.write("cpu", gen.get_state());
  }
  if (extra) archive.write("extra", extra->get_state());
  archive.save_to(file.string());
}

void load_rng_state(const std::filesystem::path& file, at::Generator* extra) {
  if (!std::filesystem::is_regular_file(file))
    throw FormatError("RNG checkpoint '" + file.string() + "' does not exist");
  torch::serialize::InputArchive archive;
  at::Tensor cpu, other;
  try {
    archive.load_from(file.string());
    archive.read("cpu", cpu);
    if (extra) archive.read("extra", other);
  } catch (const c10::Error& e) {
    throw FormatError("RNG checkpoint '" + file.string() + "' cannot be loaded: " + e.what_without_backtrace());
  }
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(gen.mutex());
    gen.set_state(cpu);
  }
  if (extra) extra->set_state(other);
}

}  // namespace hyflow::parallel
