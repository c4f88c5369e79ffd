#pragma once
// Process groups for SPMD code inside a worker group: every rank of a group builds one with
// the same master address/port; rank 0 hosts the rendezvous store (hyflow/parallel/
// rendezvous_store.hpp: it listens on master_addr only and serves a connection only after it
// proved the group's store_token). Backend::gloo runs
// collectives on CPU tensors. Backend::nccl (builds with -DHYFLOW_CUDA=ON) runs them on CUDA
// tensors: enqueued on the current CUDA stream and asynchronous for the host, watched by a
// CollectiveWatchdog that aborts the communicator once a collective has run for
// `collective_timeout` and names the op, the group and the ranks that never arrived
// (hyflow/parallel/watchdog.hpp). A gloo collective waiting for
// a peer whose process died or stopped is aborted once that peer has been silent for
// `peer_timeout` (hyflow/parallel/peer_liveness.hpp), naming it, instead of waiting for gloo's
// own timeout; abort() does the same on request.
//
// An nccl group is two groups under one name, like PyTorch's "cpu:gloo,cuda:nccl" that verl
// initialises: NCCL for CUDA tensors and a gloo group (store prefix "<name>/cpu") for CPU
// tensors and control; each collective picks by its tensor's device (collective_backend), so
// a CPU tensor never reaches NCCL. A gloo group runs every collective on gloo.

#include <hyflow/core/error.hpp>
#include <hyflow/core/torch_compat.hpp>
#include <hyflow/parallel/watchdog.hpp>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::parallel {

enum class Backend { gloo, nccl };
const char* to_string(Backend backend);

enum class ReduceOp { sum, product, min, max, avg };

struct ProcessGroupOptions {
  int rank = 0;
  int world_size = 1;
  /// Address of rank 0's store, which listens on it and on nothing else.
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  /// The address this rank's gloo pairs listen on (its own node's); empty: master_addr, right
  /// when every rank runs on the rank-0 machine.
  std::string bind_addr;
  /// The group's secret: every connection to the store proves it (HMAC-SHA256 of a nonce)
  /// before it is served. Worker groups draw a fresh one per group (WorkerEnv::store_token).
  /// Empty is a token too, one anybody can prove: for ranks that are threads of one process.
  std::string store_token;
  /// This rank's node as failures name it ("host:port" of its caf-node; empty in process): a
  /// survivor's error names the node of a dead rank and the group's other ranks on it.
  std::string node;
  Backend backend = Backend::gloo;
  /// Rendezvous timeout, and gloo's collective timeout.
  std::chrono::milliseconds timeout{30000};
  /// nccl: how long one collective may run, measured from when it starts on the device (its
  /// stream reached it), not from when it was enqueued, before the watchdog aborts the
  /// communicator. verl's `nccl_timeout` (600 s by default): ranks reaching a collective minutes
  /// apart (rollout lengths differ) is normal.
  std::chrono::milliseconds collective_timeout{600000};
  /// Key prefix in the store, so several groups can share one store.
  std::string name = "default";
  /// NCCL: the CUDA device of this rank, its own cuda index (a worker's cuda:<k>). Required: -1
  /// with backend nccl is a ValueError (the current device is 0 on every thread of a process).
  int device = -1;
  /// gloo: a collective that waits for a rank whose process has not signalled for this long
  /// (dead, stopped, cut off) is aborted, naming the rank. 0 turns the check off. Ranks signal
  /// from a thread of their own every peer_timeout / 10 (at most 500 ms) through the store.
  std::chrono::milliseconds peer_timeout{5000};
};

/// A collective that was given up because a peer is gone or abort() was called. The group
/// cannot be used again: every later collective throws it too. A gloo collective that fails
/// because a peer's connection broke (gloo names only its socket) waits up to peer_timeout for
/// the liveness check to name the rank and its node, and then throws this naming both.
class CollectiveAbortedError : public Error {
 public:
  using Error::Error;
};

/// A collective in flight (ProcessGroup::*_async). wait() blocks until it has finished and its
/// result is in the output tensor; it throws hyflow::Error naming the op and the group when the
/// collective failed (a peer died, the timeout passed). Waiting twice is a no-op.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

/// A process group for one rank. Construction blocks until every rank has joined (or the
/// timeout passes, which throws hyflow::Error naming the rank, the address and the port).
class ProcessGroup {
 public:
  explicit ProcessGroup(const ProcessGroupOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  Backend backend() const;

  /// In place, across all ranks. avg divides the sum by size() (gloo has no native avg). A bool
  /// sum is a logical or, a bool avg a ValueError (reduce_op_for).
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::sum);
  void broadcast(at::Tensor& tensor, int root);
  /// One tensor per rank, in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  /// `output` (size() * n, ...) gets every rank's `input` (n, ...) in rank order.
  void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input);
  /// `input` (size() * n, ...) is reduced across ranks; `output` (n, ...) gets this rank's block.
  void reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::sum);
  /// Makes the collective this rank waits in (gloo), and every later one, throw
  /// CollectiveAbortedError with `reason`. Thread-safe; the first reason wins. The abandoned
  /// gloo work is released in the background when gloo itself gives up.
  void abort(const std::string& reason);
  /// The reason the group was aborted, if it was.
  std::optional<std::string> aborted() const;
  /// Asynchronous all_gather_into_tensor: gloo runs it on the group's worker threads while the
  /// caller computes; nccl enqueues it on the current stream (wait() is then stream-ordered).
  /// `output` and `input` must stay alive until wait() returns.
  std::unique_ptr<Work> all_gather_into_tensor_async(at::Tensor& output, const at::Tensor& input);
  /// Asynchronous reduce_scatter. gloo (which has no reduce-scatter in LibTorch 1.13) all-reduces
  /// a copy of `input` and wait() copies this rank's block into `output`.
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::sum);
  /// Asynchronous all_reduce in place (avg divides in wait()).
  std::unique_ptr<Work> all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::sum);

  /// A group of the ranks `ranks` of this group (sorted, unique, this rank among them), over
  /// this group's store with the key prefix `name`; its rank is this rank's index in `ranks`.
  /// Every rank in `ranks` must call it with the same arguments (a rendezvous). ValueError
  /// naming the ranks when they are not a valid subset.
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks, const std::string& name);
  /// The group's name (its store key prefix), for error messages.
  const std::string& name() const;

  /// Blocks until every rank has arrived (nccl: and every earlier collective has finished).
  void barrier();
  /// Blocks until this rank's enqueued collectives have finished (nccl; gloo's are synchronous).
  /// Throws the watchdog's failure when one timed out.
  void synchronize();

  /// The rendezvous store of the group (keys are prefixed with the group name).
  KeyValueStore& store();

  /// The c10d gloo group, for code that needs the full c10d API on CPU tensors (of an nccl
  /// group: its CPU side): a c10d::ProcessGroup in LibTorch 1.13, a c10d::Backend in 2.x.
  torch_compat::GlooBase& native();

 private:
  struct Impl;
  ProcessGroup();
  std::unique_ptr<Impl> impl_;
};

/// True when this build can create NCCL process groups.
bool nccl_available();

/// The op a collective runs for `op` on `dtype`, as PyTorch maps it: a bool sum is a max (logical
/// or; NCCL would add the bytes, and 1 + 1 = 2 is no bool), a bool avg is a ValueError naming
/// `what`; everything else runs as asked. Both backends go through it.
ReduceOp reduce_op_for(ReduceOp op, at::ScalarType dtype, const std::string& what);

/// The backend that runs a collective on a tensor of `device` in a group of `backend`: nccl for
/// a CUDA tensor of an nccl group, gloo for everything else (CPU tensors of an nccl group go to
/// its gloo side).
Backend collective_backend(Backend backend, const c10::Device& device);

}  // namespace hyflow::parallel
