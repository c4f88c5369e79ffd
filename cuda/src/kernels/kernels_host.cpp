// The host build of the token kernels: the bodies in token_kernels.cuh, run by a driver that
// walks the grid (one block per row) and, inside a block, runs each phase for every thread in
// order before the next phase starts. This is exactly the device's semantics for code that only
// shares values across a barrier through shared memory (the rule the bodies keep), so the
// normal test suite checks the kernels' logic without a GPU.

#include "token_kernels.cuh"

#include <hyflow/core/error.hpp>
#include <hyflow/cuda/kernels.hpp>

#include <string>
#include <vector>

namespace hyflow::cuda::kernels {
namespace {

/// The sequential execution policy: threads are a loop, shared memory is a host buffer.
class HostExec {
 public:
  HostExec(int threads, std::vector<unsigned char>& arena) : threads_(threads), arena_(arena) {}

  int threads() const { return threads_; }
  template <class F>
  void for_threads(F&& f) {
    for (int t = 0; t < threads_; ++t) f(t);
  }
  template <class F>
  void single(F&& f) {
    f();
  }
  void sync() {}
  template <class T>
  T* shared(int64_t n) {
    used_ = (used_ + 15) & ~static_cast<int64_t>(15);
    T* p = reinterpret_cast<T*>(arena_.data() + used_);
    used_ += n * static_cast<int64_t>(sizeof(T));
    if (used_ > static_cast<int64_t>(arena_.size())) throw Error("host kernel driver: shared memory overflow");
    return p;
  }
  template <class T>
  void atomic_add(T* p, T v) {
    *p += v;
  }
  template <class T>
  T fetch_add(T* p, T v) {
    const T before = *p;
    *p += v;
    return before;
  }

 private:
  int threads_;
  std::vector<unsigned char>& arena_;
  int64_t used_ = 0;
};

void check_threads(int threads, const char* what) {
  if (threads < 1 || threads > 1024 || (threads & (threads - 1)) != 0) {
    throw ValueError(std::string(what) + ": block_threads must be a power of two in [1, 1024], got " +
                     std::to_string(threads));
  }
}

template <class Args, class Body>
void run_grid(const Args& args, int threads, const char* what, Body body) {
  check_threads(threads, what);
  std::vector<unsigned char> arena(static_cast<size_t>(detail::shared_bytes(threads)));
  for (int64_t row = 0; row < args.rows; ++row) {
    HostExec ex(threads, arena);
    body(ex, args, row);
  }
}

}  // namespace

namespace host {

void scores_forward(const ScoresForward& args, int block_threads) {
  run_grid(args, block_threads, "scores_forward",
           [](HostExec& ex, const ScoresForward& a, int64_t row) { detail::scores_forward_row(ex, a, row); });
}

void scores_backward(const ScoresBackward& args, int block_threads, int segments) {
  if (segments < 1) throw ValueError("scores_backward: segments must be >= 1, got " + std::to_string(segments));
  run_grid(args, block_threads, "scores_backward", [segments](HostExec& ex, const ScoresBackward& a, int64_t row) {
    for (int s = 0; s < segments; ++s) detail::scores_backward_row(ex, a, row, s, segments);
  });
}

void sample(const SampleArgs& args, int block_threads) {
  run_grid(args, block_threads, "sample",
           [](HostExec& ex, const SampleArgs& a, int64_t row) { detail::sample_row(ex, a, row); });
}

void primitives(const PrimitiveArgs& args) {
  for (int64_t i = 0; i < args.n; ++i) detail::primitives_at(args, i);
}

}  // namespace host
}  // namespace hyflow::cuda::kernels
