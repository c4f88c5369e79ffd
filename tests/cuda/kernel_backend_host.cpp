// The host backend of test_kernels.cpp: host memory, the host build of the kernels.
#include "kernel_backend.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

namespace kernel_test {

const char* backend_name() {
  return "host";
}
void* backend_alloc(std::size_t bytes) {
  void* p = std::malloc(bytes);
  if (!p) throw std::bad_alloc();
  return p;
}
void backend_free(void* p) {
  std::free(p);
}
void copy_to_backend(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void copy_from_backend(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void run(const hyflow::cuda::kernels::ScoresForward& a, int threads) {
  hyflow::cuda::kernels::host::scores_forward(a, threads);
}
void run(const hyflow::cuda::kernels::ScoresBackward& a, int threads) {
  hyflow::cuda::kernels::host::scores_backward(a, threads);
}
void run(const hyflow::cuda::kernels::SampleArgs& a, int threads) {
  hyflow::cuda::kernels::host::sample(a, threads);
}
void run(const hyflow::cuda::kernels::PrimitiveArgs& a) {
  hyflow::cuda::kernels::host::primitives(a);
}

}  // namespace kernel_test

int main(int argc, char* argv[]) {
  return Catch::Session().run(argc, argv);
}
