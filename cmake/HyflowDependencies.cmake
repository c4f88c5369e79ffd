# Finds the third-party packages of the selected modules (cmake/HyflowModules.cmake). All come
# from Debian packages (scripts/install-deps.sh); on GPU machines LibTorch 2.x (CUDA) comes
# from the Python torch package.

hyflow_module_packages(_hyflow_packages ${HYFLOW_MODULES})
if(HYFLOW_BUILD_TESTS)
  list(APPEND _hyflow_packages "Catch2|2")
endif()
foreach(spec IN LISTS _hyflow_packages)
  string(REPLACE "|" ";" args "${spec}")
  find_package(${args} REQUIRED)
endforeach()

# Whether LibTorch has CUDA (a GPU machine's LibTorch 2.x; Debian's has not), decided once:
# with HYFLOW_CUDA, code that needs LibTorch's CUDA API (current stream, device guard) is
# compiled only where this is 1 (cuda/src/torch_device.cpp, parallel/src/process_group.cpp).
set(HYFLOW_TORCH_CUDA 0)
if(HYFLOW_CUDA AND (CAFFE2_USE_CUDA OR TARGET torch_cuda OR TARGET c10_cuda))
  set(HYFLOW_TORCH_CUDA 1)
endif()
# Without it the tensor adapter could not reach the kernels, and CUDA tensors would be copied to the host
# every step: a configure error, unless HYFLOW_CUDA_KERNELS_ONLY asks for exactly that build (docs/gpu.md).
if(HYFLOW_CUDA AND NOT HYFLOW_TORCH_CUDA AND NOT HYFLOW_CUDA_KERNELS_ONLY)
  message(FATAL_ERROR "hyflow: -DHYFLOW_CUDA=ON needs a LibTorch built with CUDA, and the LibTorch found "
    "(${Torch_DIR}, version ${Torch_VERSION}) has none (no CAFFE2_USE_CUDA, no torch_cuda/c10_cuda target). "
    "Point CMAKE_PREFIX_PATH at a CUDA LibTorch (python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'), "
    "or add -DHYFLOW_CUDA_KERNELS_ONLY=ON to only compile the CUDA kernels and NCCL (CUDA tensors are then an error).")
endif()

# LibTorch's CMake config appends -D_GLIBCXX_USE_CXX11_ABI to the torch target; nothing else
# needs to be set globally.
message(STATUS "hyflow: modules ${HYFLOW_MODULES}; LibTorch ${Torch_VERSION}, CAF ${CAF_VERSION}")
