#include "nccl_communicator.hpp"

#include <hyflow/core/error.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <string>

namespace hyflow::parallel::detail {
namespace {

void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw Error(what + ": " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

ncclDataType_t nccl_type(NcclType t) {
  switch (t) {
    case NcclType::f32:
      return ncclFloat32;
    case NcclType::f64:
      return ncclFloat64;
    case NcclType::f16:
      return ncclFloat16;
    case NcclType::bf16:
      return ncclBfloat16;
    case NcclType::i8:
      return ncclInt8;
    case NcclType::u8:
      return ncclUint8;
    case NcclType::i32:
      return ncclInt32;
    case NcclType::i64:
      return ncclInt64;
  }
  throw ValueError("NCCL: unknown data type");
}

ncclRedOp_t nccl_op(NcclOp op) {
  switch (op) {
    case NcclOp::sum:
      return ncclSum;
    case NcclOp::product:
      return ncclProd;
    case NcclOp::min:
      return ncclMin;
    case NcclOp::max:
      return ncclMax;
    case NcclOp::avg:
      return ncclAvg;
  }
  throw ValueError("NCCL: unknown reduce op");
}

// A collective's two events: `start` recorded on the stream before the kernel (done once all
// earlier work on the stream is: the collective has started), `end` after it. Queried on the
// watchdog thread, whose device is the communicator's; destroyed with that device current.
class CudaCollectiveEvent : public CollectiveEvent {
 public:
  explicit CudaCollectiveEvent(int device) : device_(device) {
    check_cuda(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming), "cudaEventCreate");
    if (auto status = cudaEventCreateWithFlags(&end_, cudaEventDisableTiming); status != cudaSuccess) {
      cudaEventDestroy(start_);
      check_cuda(status, "cudaEventCreate");
    }
  }
  ~CudaCollectiveEvent() override {
    int current = -1;
    const bool switch_device = cudaGetDevice(&current) != cudaSuccess || current != device_;
    if (switch_device) cudaSetDevice(device_);
    cudaEventDestroy(start_);
    cudaEventDestroy(end_);
    if (switch_device && current >= 0) cudaSetDevice(current);
  }
  CudaCollectiveEvent(const CudaCollectiveEvent&) = delete;
  CudaCollectiveEvent& operator=(const CudaCollectiveEvent&) = delete;

  cudaEvent_t start() const { return start_; }
  cudaEvent_t end() const { return end_; }

  // Any status but success and cudaErrorNotReady is a device error (sticky ones included): thrown.
  State query() override {
    if (ready(end_, "the end event")) return State::done;
    return ready(start_, "the start event") ? State::running : State::queued;
  }

 private:
  static bool ready(cudaEvent_t event, const char* which) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return true;
    if (status == cudaErrorNotReady) return false;
    check_cuda(status, std::string("cudaEventQuery on ") + which);
    return false;
  }

  int device_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
};

}  // namespace

struct NcclCommunicator::Impl {
  std::string group;
  int rank = 0;
  int world_size = 1;
  int device = 0;
  ncclComm_t comm = nullptr;
  void* barrier_buffer = nullptr;  // one float on the device
  std::unique_ptr<CollectiveWatchdog> watchdog;

  void check(ncclResult_t status, const std::string& op) const {
    if (status == ncclSuccess) return;
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    throw Error("NCCL " + op + " on group '" + group + "' (rank " + std::to_string(rank) + " of " +
                std::to_string(world_size) + "): " + ncclGetErrorString(status) +
                (last && *last ? std::string(": ") + last : std::string()));
  }

  // Enqueues `launch` on `stream` between a start and an end event, through the watchdog: it
  // refuses once it failed, and never aborts the communicator while this enqueues.
  template <class Launch>
  void run(const std::string& op, void* stream, Launch launch) {
    watchdog->launch(op, [&]() -> std::unique_ptr<CollectiveEvent> {
      check_cuda(cudaSetDevice(device), "cudaSetDevice");
      auto s = static_cast<cudaStream_t>(stream);
      auto event = std::make_unique<CudaCollectiveEvent>(device);
      check_cuda(cudaEventRecord(event->start(), s), "cudaEventRecord");
      check(launch(s), op);
      check_cuda(cudaEventRecord(event->end(), s), "cudaEventRecord");
      return event;
    });
  }
};

NcclCommunicator::NcclCommunicator(KeyValueStore& store, const std::string& group, int rank, int world_size, int device,
                                   std::chrono::milliseconds timeout, std::chrono::milliseconds collective_timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->group = group;
  impl_->rank = rank;
  impl_->world_size = world_size;
  // No cudaGetDevice() fallback: the current device is 0 on every thread of a process, so the
  // worker threads of one process would all land on GPU 0.
  if (device < 0)
    throw ValueError("NCCL group '" + group + "' rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
                     ": no CUDA device given (device " + std::to_string(device) +
                     "); pass the rank's own device (its local cuda index)");
  impl_->device = device;
  check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  // Every rank alive before NCCL's own (unbounded) rendezvous, so a missing rank is named.
  store_barrier(store, group + "/nccl_join", rank, world_size, timeout);
  auto id_bytes = exchange_unique_id(
      store, rank, group + "/nccl_unique_id",
      [&] {
        ncclUniqueId id;
        impl_->check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        return std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id);
      },
      timeout);
  ncclUniqueId id;
  if (id_bytes.size() != sizeof id) {
    throw Error("NCCL group '" + group + "': the unique id from the store has " + std::to_string(id_bytes.size()) +
                " bytes, expected " + std::to_string(sizeof id));
  }
  std::memcpy(&id, id_bytes.data(), sizeof id);
  impl_->check(ncclCommInitRank(&impl_->comm, world_size, id, rank), "ncclCommInitRank");
  check_cuda(cudaMalloc(&impl_->barrier_buffer, sizeof(float)), "cudaMalloc");
  ncclComm_t comm = impl_->comm;
  impl_->watchdog = std::make_unique<CollectiveWatchdog>(
      CollectiveWatchdog::Options{.group = group,
                                  .rank = rank,
                                  .world_size = world_size,
                                  .timeout = collective_timeout,
                                  // the watchdog thread's event queries and destruction on this device, not on 0
                                  .on_thread_start = [device] { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }},
      &store, [comm] { ncclCommAbort(comm); });
}

NcclCommunicator::~NcclCommunicator() {
  // Let pending collectives finish under the watchdog first: a stuck one is aborted within the
  // timeout instead of hanging ncclCommDestroy.
  bool aborted = false;
  if (impl_->watchdog) {
    try {
      impl_->watchdog->wait_all();
    } catch (const Error&) {
      // the failure was reported to the calls that saw it; the communicator is aborted
    }
    aborted = impl_->watchdog->failed();
    impl_->watchdog.reset();
  }
  if (impl_->barrier_buffer) cudaFree(impl_->barrier_buffer);
  if (impl_->comm && !aborted) ncclCommDestroy(impl_->comm);
}

int NcclCommunicator::device() const {
  return impl_->device;
}

void NcclCommunicator::all_reduce(const void* send, void* recv, std::size_t count, NcclType type, NcclOp op,
                                  void* stream) {
  impl_->run("all_reduce", stream, [&](cudaStream_t s) {
    return ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), impl_->comm, s);
  });
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t count, NcclType type, void* stream) {
  impl_->run("all_gather", stream,
             [&](cudaStream_t s) { return ncclAllGather(send, recv, count, nccl_type(type), impl_->comm, s); });
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::size_t count, NcclType type, NcclOp op,
                                      void* stream) {
  impl_->run("reduce_scatter", stream, [&](cudaStream_t s) {
    return ncclReduceScatter(send, recv, count, nccl_type(type), nccl_op(op), impl_->comm, s);
  });
}

void NcclCommunicator::broadcast(void* buffer, std::size_t count, NcclType type, int root, void* stream) {
  if (root < 0 || root >= impl_->world_size) {
    throw ValueError("NCCL broadcast: root " + std::to_string(root) + " outside world size " +
                     std::to_string(impl_->world_size));
  }
  impl_->run("broadcast", stream, [&](cudaStream_t s) {
    return ncclBroadcast(buffer, buffer, count, nccl_type(type), root, impl_->comm, s);
  });
}

void NcclCommunicator::barrier(void* stream) {
  impl_->run("barrier", stream, [&](cudaStream_t s) {
    return ncclAllReduce(impl_->barrier_buffer, impl_->barrier_buffer, 1, ncclFloat32, ncclSum, impl_->comm, s);
  });
  synchronize();
}

void NcclCommunicator::synchronize() {
  impl_->watchdog->wait_all();
}

}  // namespace hyflow::parallel::detail
