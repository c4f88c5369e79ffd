#include <hyflow/parallel/process_group.hpp>

#include <hyflow/core/error.hpp>

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>


#include <cstring>

namespace hyflow::parallel {

const char* to_string(Backend backend) { return backend == Backend::gloo ? "gloo" : "nccl"; }

bool nccl_available() {
#ifdef HYFLOW_WITH_NCCL
  return true;
#else
  return false;
#endif
}

struct ProcessGroup::Impl {
  ProcessGroupOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

namespace {
std::string where(const ProcessGroupOptions& o) {
  return "rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size) + ", store " + o.master_addr + ":" +
         std::to_string(o.master_port);
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return c10d::ReduceOp::SUM;
    case ReduceOp::product:
      return c10d::ReduceOp::PRODUCT;
    case ReduceOp::min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::max:
      return c10d::ReduceOp::MAX;
  }
  throw ValueError("unknown ReduceOp");
}
}  // namespace

ProcessGroup::ProcessGroup(const ProcessGroupOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size)
    throw ValueError("ProcessGroup: rank " + std::to_string(options.rank) + " is outside world size " +
                     std::to_string(options.world_size));
  if (options.master_port <= 0 || options.master_port > 65535)
    throw ValueError("ProcessGroup: master port " + std::to_string(options.master_port) + " is not a valid port (" +
                     where(options) + ")");
  if (options.backend == Backend::nccl && !nccl_available())
    throw ValueError("ProcessGroup: backend nccl needs a CUDA build of hyflow (-DHYFLOW_CUDA=ON with NCCL); this build "
                     "has gloo only (" + where(options) + ")");
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(options.master_port);
    store_options.isServer = options.rank == 0;
    store_options.numWorkers = static_cast<std::size_t>(options.world_size);
    store_options.waitWorkers = false;
    store_options.timeout = options.timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
    impl_->store = c10::make_intrusive<c10d::PrefixStore>(options.name, tcp);
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.master_addr));
    impl_->group =
        c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, options.rank, options.world_size, gloo_options);
  } catch (const c10::Error& e) {
    throw Error("ProcessGroup rendezvous failed (" + where(options) + "): " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Error("ProcessGroup rendezvous failed (" + where(options) + "): " + e.what());
  }
}

ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return impl_->options.rank; }
int ProcessGroup::size() const { return impl_->options.world_size; }
Backend ProcessGroup::backend() const { return impl_->options.backend; }
c10d::ProcessGroup& ProcessGroup::native() { return *impl_->group; }

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  impl_->group->allreduce(tensors, opts)->wait();
  if (op == ReduceOp::avg) tensor.div_(size());
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= size())
    throw ValueError("broadcast: root " + std::to_string(root) + " outside world size " + std::to_string(size()));
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  impl_->group->broadcast(tensors, opts)->wait();
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  std::vector<at::Tensor> input{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < size(); ++r) output[0].push_back(at::empty_like(input[0]));
  impl_->group->allgather(output, input)->wait();
  return output[0];
}

void ProcessGroup::barrier() { impl_->group->barrier()->wait(); }

}  // namespace hyflow::parallel
