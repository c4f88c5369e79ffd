#pragma once
// Where test_kernels.cpp runs the token kernels: the host build (kernel_backend_host.cpp) or a
// CUDA device (kernel_backend_device.cpp). The test source is the same for both executables,
// so the device runs exactly the assertions the host build passes.

#include <hyflow/cuda/kernels.hpp>

#include <cstddef>
#include <vector>

namespace kernel_test {

/// "host" or "device".
const char* backend_name();

/// Memory the backend's kernels can read and write (host memory or device memory).
void* backend_alloc(std::size_t bytes);
void backend_free(void* p);
void copy_to_backend(void* dst, const void* src, std::size_t bytes);
void copy_from_backend(void* dst, const void* src, std::size_t bytes);

/// Run a kernel on backend pointers (blocks of `threads` threads) and wait for it.
constexpr int kThreads = hyflow::cuda::kernels::kDefaultBlockThreads;
void run(const hyflow::cuda::kernels::ScoresForward& args, int threads = kThreads);
void run(const hyflow::cuda::kernels::ScoresBackward& args, int threads = kThreads);
void run(const hyflow::cuda::kernels::SampleArgs& args, int threads = kThreads);
/// The shared arithmetic (Philox, 16-bit conversions) computed by the backend.
void run(const hyflow::cuda::kernels::PrimitiveArgs& args);

/// A backend buffer holding a copy of `host` (or `n` uninitialized elements).
template <class T>
class Buffer {
 public:
  explicit Buffer(const std::vector<T>& host) : n_(host.size()), p_(backend_alloc(bytes())) {
    if (n_ > 0) copy_to_backend(p_, host.data(), n_ * sizeof(T));
  }
  explicit Buffer(std::size_t n) : n_(n), p_(backend_alloc(bytes())) {}
  ~Buffer() { backend_free(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  std::vector<T> read() const {
    std::vector<T> out(n_);
    if (n_ > 0) copy_from_backend(out.data(), p_, n_ * sizeof(T));
    return out;
  }

 private:
  std::size_t bytes() const { return (n_ == 0 ? 1 : n_) * sizeof(T); }
  std::size_t n_;
  void* p_;
};

}  // namespace kernel_test
