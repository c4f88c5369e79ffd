# Compiler settings shared by every hyflow target: language level, warnings,
# assertions in optimized builds, sanitizers and ccache.

set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
# The .cu sources keep to C++17: CMake 3.25 knows no C++20 flag for nvcc.
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
# One PIC setting everywhere so that precompiled headers can be shared between targets.
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()

if(HYFLOW_ASSERTIONS)
  foreach(cfg RELEASE RELWITHDEBINFO MINSIZEREL)
    string(REPLACE "-DNDEBUG" "" CMAKE_CXX_FLAGS_${cfg} "${CMAKE_CXX_FLAGS_${cfg}}")
  endforeach()
endif()

# Warnings apply to our targets only (hyflow_set_warnings), never to dependencies.
function(hyflow_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter -Wno-missing-field-initializers>)
endfunction()

if(HYFLOW_SANITIZE)
  string(REPLACE "," ";" _sanitizers "${HYFLOW_SANITIZE}")
  foreach(s IN LISTS _sanitizers)
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "HYFLOW_SANITIZE: unknown sanitizer '${s}' (address, undefined, thread, leak)")
    endif()
  endforeach()
  set(_flags "-fsanitize=${HYFLOW_SANITIZE}" -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_flags}>")
  add_link_options(${_flags})
endif()

find_program(HYFLOW_CCACHE ccache)
if(HYFLOW_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  # ccache must be told that precompiled headers are safe to cache; a base directory makes
  # paths relative, so fresh clones elsewhere (CI) hit the same cache entries.
  set(CMAKE_CXX_COMPILER_LAUNCHER
      env "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}" ${HYFLOW_CCACHE})
  message(STATUS "hyflow: compiling through ccache (${HYFLOW_CCACHE})")
endif()
if(HYFLOW_CCACHE AND HYFLOW_CUDA AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
  set(CMAKE_CUDA_COMPILER_LAUNCHER env "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}" ${HYFLOW_CCACHE})
endif()
