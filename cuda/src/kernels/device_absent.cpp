// Built instead of kernels_device.cu when hyflow is configured without CUDA (HYFLOW_CUDA=OFF):
// there are no device kernels, so there is no device, and a launch is an error that says how to
// get one. The tensor adapter never launches here: it sends CUDA tensors to the kernels only in
// a build whose LibTorch has CUDA (cuda/src/torch_device.cpp).
#include <hyflow/core/error.hpp>
#include <hyflow/cuda/kernels.hpp>

#include <string>

namespace hyflow::cuda::kernels::device {
namespace {
[[noreturn]] void absent(const char* what) {
  throw Error(std::string("hyflow::cuda::kernels::device::") + what +
              ": this build has no CUDA kernels (configure with -DHYFLOW_CUDA=ON)");
}
}  // namespace

bool available() {
  return false;
}
int device_count() {
  return 0;
}
double memory_bandwidth(int) {
  return 0.0;
}
void scores_forward(const ScoresForward&, void*, int) {
  absent("scores_forward");
}
void scores_backward(const ScoresBackward&, void*, int) {
  absent("scores_backward");
}
void sample(const SampleArgs&, void*, int) {
  absent("sample");
}
void primitives(const PrimitiveArgs&, void*) {
  absent("primitives");
}
}  // namespace hyflow::cuda::kernels::device
