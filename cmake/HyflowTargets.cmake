# Helpers that give every module the same shape:
#   hyflow_add_library(<module> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...] [PCH torch|caf|torch_caf])
#     -> target hyflow_<module>, alias hyflow::<module>, headers in <module>/include,
#        exported for find_package(hyflow COMPONENTS <module>) in its own export set.
#   hyflow_add_test(<name> SOURCES ... DEPS ... [LABELS ...] [PCH ...] [TIMEOUT s])
#     -> Catch2 executable registered with CTest (label "unit" unless told otherwise).
#   hyflow_add_executable(<name> SOURCES ... DEPS ... [PCH ...] [INSTALL] [EXPORTS])

# --- precompiled headers ---------------------------------------------------------------
# One PCH per header set, compiled once and reused by every target that asks for it
# (REUSE_FROM needs identical flags: PIC and warnings are the same everywhere).
set(HYFLOW_PCH_HEADERS_torch <torch/torch.h> <nlohmann/json.hpp> <vector> <string> <map>)
set(HYFLOW_PCH_HEADERS_caf <caf/all.hpp> <caf/io/all.hpp> <nlohmann/json.hpp> <vector> <string>)
set(HYFLOW_PCH_HEADERS_torch_caf <torch/torch.h> <caf/all.hpp> <caf/io/all.hpp>
    <nlohmann/json.hpp> <vector> <string>)
set(HYFLOW_PCH_DEPS_torch torch nlohmann_json::nlohmann_json)
set(HYFLOW_PCH_DEPS_caf caf::io nlohmann_json::nlohmann_json)
set(HYFLOW_PCH_DEPS_torch_caf torch caf::io nlohmann_json::nlohmann_json)

function(_hyflow_pch_target kind out)
  set(pch_target hyflow_pch_${kind})
  if(NOT TARGET ${pch_target})
    if(NOT DEFINED HYFLOW_PCH_HEADERS_${kind})
      message(FATAL_ERROR "hyflow: unknown PCH kind '${kind}' (torch, caf, torch_caf)")
    endif()
    set(src "${CMAKE_BINARY_DIR}/pch/${pch_target}.cpp")
    file(WRITE "${src}" "// precompiled header carrier\n")
    add_library(${pch_target} OBJECT "${src}")
    target_link_libraries(${pch_target} PRIVATE ${HYFLOW_PCH_DEPS_${kind}})
    hyflow_set_warnings(${pch_target})
    target_precompile_headers(${pch_target} PRIVATE ${HYFLOW_PCH_HEADERS_${kind}})
  endif()
  set(${out} ${pch_target} PARENT_SCOPE)
endfunction()

function(_hyflow_apply_pch target kind)
  if(NOT HYFLOW_PCH OR NOT kind OR kind STREQUAL "none")
    return()
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    # The PCH is built -fPIC (libraries); executables would get -fPIE and reject it.
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
  _hyflow_pch_target(${kind} pch_target)
  target_precompile_headers(${target} REUSE_FROM ${pch_target})
  # REUSE_FROM does not carry usage requirements: the PCH's own deps must be visible.
  target_link_libraries(${target} PRIVATE ${HYFLOW_PCH_DEPS_${kind}})
endfunction()

# --- libraries ---------------------------------------------------------------------------
set_property(GLOBAL PROPERTY HYFLOW_EXPORTED_MODULES "")

function(hyflow_add_library module)
  cmake_parse_arguments(ARG "" "PCH" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(target hyflow_${module})
  add_library(${target} ${ARG_SOURCES})
  add_library(hyflow::${module} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${module} OUTPUT_NAME hyflow_${module})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  target_compile_features(${target} PUBLIC cxx_std_20)
  hyflow_set_warnings(${target})
  _hyflow_apply_pch(${target} "${ARG_PCH}")
  install(TARGETS ${target} EXPORT hyflow_${module}Targets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  set_property(GLOBAL APPEND PROPERTY HYFLOW_EXPORTED_MODULES ${module})
endfunction()

# --- tests -------------------------------------------------------------------------------
function(_hyflow_catch_main out)
  if(NOT TARGET hyflow_catch_main)
    find_package(Catch2 2 REQUIRED)
    set(src "${CMAKE_BINARY_DIR}/catch_main/catch_main.cpp")
    file(WRITE "${src}" "#define CATCH_CONFIG_MAIN\n#include <catch2/catch.hpp>\n")
    add_library(hyflow_catch_main STATIC "${src}")
    target_link_libraries(hyflow_catch_main PUBLIC Catch2::Catch2)
  endif()
  set(${out} hyflow_catch_main PARENT_SCOPE)
endfunction()

function(hyflow_add_test name)
  cmake_parse_arguments(ARG "NO_MAIN" "PCH;TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  if(ARG_NO_MAIN)
    find_package(Catch2 2 REQUIRED)
    target_link_libraries(${name} PRIVATE Catch2::Catch2 ${ARG_DEPS})
  else()
    _hyflow_catch_main(main)
    target_link_libraries(${name} PRIVATE ${main} ${ARG_DEPS})
  endif()
  hyflow_set_warnings(${name})
  _hyflow_apply_pch(${name} "${ARG_PCH}")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${name} --order rand --rng-seed 20261122)
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# --- executables (apps, benches, examples) -----------------------------------------------
function(hyflow_add_executable name)
  cmake_parse_arguments(ARG "INSTALL;EXPORTS" "PCH" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  if(ARG_EXPORTS)  # plugins loaded with dlopen resolve hyflow's functions in the program
    set_target_properties(${name} PROPERTIES ENABLE_EXPORTS ON)
  endif()
  hyflow_set_warnings(${name})
  _hyflow_apply_pch(${name} "${ARG_PCH}")
  if(ARG_INSTALL)
    install(TARGETS ${name} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endfunction()
