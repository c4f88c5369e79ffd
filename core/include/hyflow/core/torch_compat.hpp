#pragma once
// The one place that knows how LibTorch 1.13 (Debian's, the CPU builds) and LibTorch 2.x (the
// pip wheel of a GPU machine) differ in the APIs hyflow's CUDA and parallel code touches.
// Header-only, for targets that link torch (cuda, parallel and their tests); docs/gpu.md lists
// what it covers and what was checked against which version.
//
//   GlooBase          the class c10d::ProcessGroupGloo derives from: c10d::ProcessGroup in 1.13,
//                     c10d::Backend in 2.x (2.0 split process groups from their backends).
//   Optional<T>       c10::optional in 1.13; in 2.x std::optional (c10::optional became an
//                     alias of it in 2.4 and is deprecated), what ATen's signatures take.
//   current_stream    the raw cudaStream_t of a device's current CUDA stream, and
//   side_stream       a stream from LibTorch's pool (what tests use as a non-default stream),
//                     only with HYFLOW_TORCH_CUDA (a CUDA LibTorch).

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <optional>
#else
#include <c10/util/Optional.h>
#endif

#if defined(HYFLOW_TORCH_CUDA) && HYFLOW_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace c10d {
#if TORCH_VERSION_MAJOR >= 2
class Backend;
#else
class ProcessGroup;
#endif
}  // namespace c10d

namespace hyflow::torch_compat {

#if TORCH_VERSION_MAJOR >= 2
using GlooBase = c10d::Backend;
template <class T>
using Optional = std::optional<T>;
#else
using GlooBase = c10d::ProcessGroup;
template <class T>
using Optional = c10::optional<T>;
#endif

#if defined(HYFLOW_TORCH_CUDA) && HYFLOW_TORCH_CUDA
/// The cudaStream_t (as void*) of `device`'s current CUDA stream: what a kernel launched for a
/// tensor on that device must be enqueued on. getCurrentCUDAStream(DeviceIndex) in 1.13 and 2.x.
inline void* current_stream(c10::DeviceIndex device) {
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(device).stream());
}
/// A stream of LibTorch's pool on `device`, not the default one. 2.2 added an int-priority
/// overload of getStreamFromPool next to the bool one; the bool argument picks the same in both.
inline c10::cuda::CUDAStream side_stream(c10::DeviceIndex device) {
  return c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
}
#endif

}  // namespace hyflow::torch_compat
