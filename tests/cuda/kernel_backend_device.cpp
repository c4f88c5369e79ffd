// The device backend of test_kernels.cpp: CUDA memory, the nvcc build of the kernels. Without a
// CUDA device the program prints why and exits with 77, which CTest reports as
// "Not Run (Skipped)" (SKIP_RETURN_CODE), never as passed.
#include "kernel_backend.hpp"

#include <cuda_runtime.h>

#include <iostream>
#include <stdexcept>
#include <string>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

namespace kernel_test {
namespace {
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}
}  // namespace

const char* backend_name() {
  return "device";
}
void* backend_alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
void backend_free(void* p) {
  cudaFree(p);
}
void copy_to_backend(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}
void copy_from_backend(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}
void run(const hyflow::cuda::kernels::ScoresForward& a, int threads) {
  hyflow::cuda::kernels::device::scores_forward(a, nullptr, threads);
  check(cudaDeviceSynchronize(), "scores_forward");
}
void run(const hyflow::cuda::kernels::ScoresBackward& a, int threads) {
  hyflow::cuda::kernels::device::scores_backward(a, nullptr, threads);
  check(cudaDeviceSynchronize(), "scores_backward");
}
void run(const hyflow::cuda::kernels::SampleArgs& a, int threads) {
  hyflow::cuda::kernels::device::sample(a, nullptr, threads);
  check(cudaDeviceSynchronize(), "sample");
}
void run(const hyflow::cuda::kernels::PrimitiveArgs& a) {
  hyflow::cuda::kernels::device::primitives(a, nullptr);
  check(cudaDeviceSynchronize(), "primitives");
}

}  // namespace kernel_test

int main(int argc, char* argv[]) {
  if (!hyflow::cuda::kernels::device::available()) {
    std::cout << "SKIPPED: no CUDA device visible; the device kernels were built but not run\n";
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
