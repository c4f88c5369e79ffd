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

# LibTorch's CMake config appends -D_GLIBCXX_USE_CXX11_ABI to the torch target; nothing else
# needs to be set globally.
message(STATUS "hyflow: modules ${HYFLOW_MODULES}; LibTorch ${Torch_VERSION}, CAF ${CAF_VERSION}")
