// The device build of the token kernels (nvcc): the bodies of token_kernels.cuh as CUDA
// kernels, one block of kDefaultBlockThreads threads per row (the backward: several per row at
// small batch, segments_for), shared memory from the launch.

#include "token_kernels.cuh"

#include <hyflow/core/error.hpp>
#include <hyflow/cuda/kernels.hpp>

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

namespace hyflow::cuda::kernels {
namespace {

/// The CUDA execution policy: this thread is threadIdx.x, shared memory is the dynamic buffer.
class DeviceExec {
 public:
  __device__ explicit DeviceExec(unsigned char* smem) : smem_(smem) {}
  __device__ int threads() const { return static_cast<int>(blockDim.x); }
  template <class F>
  __device__ void for_threads(F&& f) {
    f(static_cast<int>(threadIdx.x));
  }
  template <class F>
  __device__ void single(F&& f) {
    if (threadIdx.x == 0) f();
  }
  __device__ void sync() { __syncthreads(); }
  template <class T>
  __device__ T* shared(int64_t n) {
    used_ = (used_ + 15) & ~static_cast<int64_t>(15);
    T* p = reinterpret_cast<T*>(smem_ + used_);
    used_ += n * static_cast<int64_t>(sizeof(T));
    return p;
  }
  __device__ void atomic_add(uint32_t* p, uint32_t v) { atomicAdd(p, v); }
  __device__ uint32_t fetch_add(uint32_t* p, uint32_t v) { return atomicAdd(p, v); }
  __device__ void atomic_add(uint64_t* p, uint64_t v) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  }

 private:
  unsigned char* smem_;
  int64_t used_ = 0;
};

__global__ void scores_forward_kernel(ScoresForward args) {
  extern __shared__ __align__(16) unsigned char smem[];
  DeviceExec ex(smem);
  detail::scores_forward_row(ex, args, static_cast<int64_t>(blockIdx.x));
}

// blockIdx.y: the segment of the row (gridDim.y segments).
__global__ void scores_backward_kernel(ScoresBackward args) {
  extern __shared__ __align__(16) unsigned char smem[];
  DeviceExec ex(smem);
  detail::scores_backward_row(ex, args, static_cast<int64_t>(blockIdx.x), static_cast<int>(blockIdx.y),
                              static_cast<int>(gridDim.y));
}

__global__ void sample_kernel(SampleArgs args) {
  extern __shared__ __align__(16) unsigned char smem[];
  DeviceExec ex(smem);
  detail::sample_row(ex, args, static_cast<int64_t>(blockIdx.x));
}

__global__ void primitives_kernel(PrimitiveArgs args) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < args.n; i += stride)
    detail::primitives_at(args, i);
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string("CUDA kernel ") + what + ": " + cudaGetErrorName(status) + ": " +
                cudaGetErrorString(status));
  }
}

/// Blocks per row of an elementwise kernel: enough rows x segments to give every SM of the
/// current device two blocks, each segment still at least 32 elements per thread.
int segments_for(int64_t rows, int64_t vocab, int threads) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute(SMs)");
  const int64_t wanted = (2 * static_cast<int64_t>(sms) + rows - 1) / rows;
  const int64_t most = vocab / (static_cast<int64_t>(threads) * 8 * 4);
  const int64_t segments = wanted < most ? wanted : most;
  return segments < 1 ? 1 : static_cast<int>(segments < 65535 ? segments : 65535);
}

template <class Kernel, class Args>
void launch(Kernel kernel, const Args& args, void* stream, const char* what, int threads, int segments = 1) {
  if (threads < 1 || threads > 1024 || (threads & (threads - 1)) != 0) {
    throw ValueError(std::string(what) + ": block_threads must be a power of two in [1, 1024], got " +
                     std::to_string(threads));
  }
  if (args.rows == 0) return;
  if (args.rows > 0x7fffffff) throw ValueError(std::string(what) + ": more than 2^31-1 rows");
  const auto smem = static_cast<size_t>(detail::shared_bytes(threads));
  const dim3 grid(static_cast<unsigned>(args.rows), static_cast<unsigned>(segments));
  kernel<<<grid, threads, smem, static_cast<cudaStream_t>(stream)>>>(args);
  check(cudaGetLastError(), what);
}

}  // namespace

namespace device {

int device_count() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status == cudaSuccess) return n;
  (void)cudaGetLastError();  // clear the error before anything else asks the runtime
  // "No device" is a machine without a driver or a driver without devices. The runtime reports a
  // missing driver as "insufficient driver" too, so that case is told apart by whether it could
  // load libcuda.so.1 (RTLD_NOLOAD: only asks whether the library is already loaded).
  const bool no_driver_library = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) == nullptr;
  if (status == cudaErrorNoDevice || status == cudaErrorStubLibrary ||
      (status == cudaErrorInsufficientDriver && no_driver_library))
    return 0;
  throw Error(std::string("CUDA: cudaGetDeviceCount failed: ") + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + "); the driver is loaded but cannot serve this CUDA runtime");
}

bool available() {
  return device_count() > 0;
}

double memory_bandwidth(int device) {
  int khz = 0, bits = 0;
  check(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device), "cudaDeviceGetAttribute(memory clock)");
  check(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device), "cudaDeviceGetAttribute(bus width)");
  return 2.0 * static_cast<double>(khz) * 1e3 * static_cast<double>(bits) / 8.0;
}

void scores_forward(const ScoresForward& args, void* stream, int block_threads) {
  launch(scores_forward_kernel, args, stream, "scores_forward", block_threads);
}
void scores_backward(const ScoresBackward& args, void* stream, int block_threads) {
  launch(scores_backward_kernel, args, stream, "scores_backward", block_threads,
         args.rows > 0 ? segments_for(args.rows, args.vocab, block_threads) : 1);
}
void sample(const SampleArgs& args, void* stream, int block_threads) {
  launch(sample_kernel, args, stream, "sample", block_threads);
}
void primitives(const PrimitiveArgs& args, void* stream) {
  if (args.n <= 0) return;
  const int64_t blocks = (args.n + 255) / 256;
  primitives_kernel<<<static_cast<unsigned>(blocks < 1024 ? blocks : 1024), 256, 0,
                      static_cast<cudaStream_t>(stream)>>>(args);
  check(cudaGetLastError(), "primitives");
}

}  // namespace device
}  // namespace hyflow::cuda::kernels
