#pragma once
// An NCCL communicator on raw device pointers (no torch): built with HYFLOW_CUDA into
// hyflow::collectives; ProcessGroup (process_group.cpp) adapts tensors to it. Every collective
// is enqueued on the caller's stream (asynchronous for the host, ordered with the work around it
// on that stream) through a CollectiveWatchdog, between a start and an end event.

#include <hyflow/parallel/watchdog.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace hyflow::parallel::detail {

enum class NcclType { f32, f64, f16, bf16, i8, u8, i32, i64 };
enum class NcclOp { sum, product, min, max, avg };

class NcclCommunicator {
 public:
  /// Joins group `group` as `rank` of `world_size` on CUDA device `device` (>= 0, the rank's own;
  /// a negative one is a ValueError naming the group and rank, before any CUDA call): a store
  /// barrier (a timeout names the missing ranks), the unique id from rank 0 through the store,
  /// ncclCommInitRank. Throws hyflow::Error with NCCL's message on failure.
  /// `timeout` bounds the rendezvous; `collective_timeout` is the watchdog's: how long one
  /// collective may run once it has started on the device.
  NcclCommunicator(KeyValueStore& store, const std::string& group, int rank, int world_size, int device,
                   std::chrono::milliseconds timeout,
                   std::chrono::milliseconds collective_timeout = std::chrono::minutes(10));
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  void all_reduce(const void* send, void* recv, std::size_t count, NcclType type, NcclOp op, void* stream);
  /// recv holds world_size * count elements, rank r's at r * count.
  void all_gather(const void* send, void* recv, std::size_t count, NcclType type, void* stream);
  /// send holds world_size * count elements; recv gets this rank's reduced block of `count`.
  void reduce_scatter(const void* send, void* recv, std::size_t count, NcclType type, NcclOp op, void* stream);
  void broadcast(void* buffer, std::size_t count, NcclType type, int root, void* stream);
  /// An all-reduce of one value on `stream`, then waits for every pending collective.
  void barrier(void* stream);
  /// Waits for every pending collective; throws the watchdog's failure.
  void synchronize();
  int device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyflow::parallel::detail
