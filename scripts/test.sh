#!/usr/bin/env bash
# The whole test suite from a clean clone (what CI's .ci/run runs):
#   1. dependencies, Release build with assertions, every CTest test except those labelled
#      "known-flaky" (listed in docs/architecture.md with the reason);
#   2. the smallest documented module subset (dataproto;actors, the embedding build) configures
#      and builds on its own, with its tests;
#   3. the tests labelled "sanitize" (the code that parses untrusted bytes and the pure-math
#      modules) again under address+undefined sanitizers, at -O1 (only their targets are built
#      a second time);
#   4. where nvcc is on the PATH: the CUDA code compiled and linked in a small -DHYFLOW_CUDA=ON
#      build of the cuda and parallel modules (only these targets: the nvcc kernels, the NCCL
#      communicator, process_group.cpp's NCCL branch, their tests), the host-build kernel tests
#      run again against it, and the GPU tests reported "Not Run (Skipped)" without a device. It
#      configures with -DHYFLOW_CUDA_KERNELS_ONLY=ON (Debian's LibTorch has no CUDA), and checks that
#      without that opt-out the configuration is refused.
# Set HYFLOW_SKIP_SANITIZE=1 to skip step 3, HYFLOW_SKIP_SUBSET=1 to skip step 2,
# HYFLOW_SKIP_CUDA=1 to skip step 4.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start )) s"; }
scripts/install-deps.sh
scripts/build.sh build
ctest --test-dir build --output-on-failure --no-tests=error -LE known-flaky -j "$(nproc)"
echo "test.sh: Release suite passed after $(elapsed)"

if [ "${HYFLOW_SKIP_SUBSET:-0}" != 1 ]; then
  scripts/build.sh build-subset -DHYFLOW_MODULES="dataproto;actors" -DHYFLOW_BUILD_BENCH=OFF
  echo "test.sh: the dataproto;actors subset built after $(elapsed)"
fi

if [ "${HYFLOW_SKIP_SANITIZE:-0}" != 1 ]; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B build-asan "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
    -DHYFLOW_SANITIZE=address,undefined -DHYFLOW_BUILD_BENCH=OFF -DHYFLOW_BUILD_APPS=OFF >/dev/null
  # Test names are their executables' target names (hyflow_add_test).
  mapfile -t targets < <(ctest --test-dir build-asan -N -L sanitize | sed -n 's/^ *Test *#[0-9]*: *//p')
  [ ${#targets[@]} -gt 0 ] || { echo "test.sh: no tests labelled sanitize" >&2; exit 1; }
  cmake --build build-asan -j "$(nproc)" --target "${targets[@]}"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure --no-tests=error -L sanitize -j "$(nproc)"
  echo "test.sh: sanitizer suite passed after $(elapsed)"
fi

# The CUDA toolkit's default place, when its bin/ is not on the PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
if [ "${HYFLOW_SKIP_CUDA:-0}" != 1 ] && command -v nvcc >/dev/null && command -v ninja >/dev/null; then
  cuda_start=$(date +%s)
  cuda_build=${HYFLOW_CUDA_BUILD_DIR:-build-cuda}
  # Without the opt-out, -DHYFLOW_CUDA=ON against this CPU LibTorch must refuse to configure (a few seconds).
  refused=$(mktemp -d)
  if cmake -S . -B "$refused" -G Ninja -DHYFLOW_CUDA=ON -DHYFLOW_MODULES=cuda -DHYFLOW_BUILD_TESTS=OFF \
    -DHYFLOW_BUILD_BENCH=OFF -DHYFLOW_BUILD_APPS=OFF >"$refused.log" 2>&1 ||
    ! grep -q 'needs a LibTorch built with CUDA' "$refused.log"; then
    cat "$refused.log" >&2
    echo "test.sh: -DHYFLOW_CUDA=ON against a LibTorch without CUDA did not refuse to configure" >&2
    exit 1
  fi
  rm -rf "$refused" "$refused.log"
  cmake -S . -B "$cuda_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHYFLOW_CUDA=ON -DHYFLOW_CUDA_KERNELS_ONLY=ON \
    -DHYFLOW_MODULES="cuda;parallel" -DHYFLOW_BUILD_BENCH=OFF -DHYFLOW_BUILD_APPS=OFF >/dev/null
  cmake --build "$cuda_build" -j "$(nproc)" --target hyflow_cuda_kernels test_cuda_kernels_host \
    test_cuda_kernels_device test_collectives test_nccl_device \
    parallel/CMakeFiles/hyflow_parallel.dir/src/process_group.cpp.o
  ctest --test-dir "$cuda_build" --output-on-failure --no-tests=error \
    -R '^(test_cuda_kernels_host|test_cuda_kernels_device|test_collectives|test_nccl_device)$'
  echo "test.sh: CUDA build and tests passed after $(elapsed) (this step: $(( $(date +%s) - cuda_start )) s)"
fi
