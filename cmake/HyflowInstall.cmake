# Installs the exported targets and hyflowConfig.cmake so that another CMake project can
#   find_package(hyflow REQUIRED COMPONENTS dataproto)   # only dataproto, core and their packages
#   target_link_libraries(app PRIVATE hyflow::dataproto)
# or find_package(hyflow REQUIRED) for every module of the installation. Each module has its
# own export file; the config loads a component's modules and finds their packages only
# (cmake/HyflowModules.cmake), so a dataproto consumer needs neither CAF nor Boost.
include(CMakePackageConfigHelpers)

set(HYFLOW_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/hyflow)
get_property(HYFLOW_EXPORTED_MODULES GLOBAL PROPERTY HYFLOW_EXPORTED_MODULES)
foreach(module IN LISTS HYFLOW_EXPORTED_MODULES)
  install(EXPORT hyflow_${module}Targets NAMESPACE hyflow:: FILE hyflow_${module}Targets.cmake
          DESTINATION ${HYFLOW_CMAKE_DIR})
endforeach()

# The graph and packages of the installed modules, written into the config file.
set(HYFLOW_CONFIG_GRAPH "")
foreach(module IN LISTS HYFLOW_EXPORTED_MODULES)
  set(deps "")
  foreach(dep IN LISTS HYFLOW_MODULE_DEPS_${module})
    if(dep IN_LIST HYFLOW_EXPORTED_MODULES)
      list(APPEND deps ${dep})
    endif()
  endforeach()
  string(APPEND HYFLOW_CONFIG_GRAPH "set(_hyflow_deps_${module} \"${deps}\")\n")
  string(APPEND HYFLOW_CONFIG_GRAPH "set(_hyflow_packages_${module} \"${HYFLOW_MODULE_PACKAGES_${module}}\")\n")
endforeach()

configure_package_config_file(cmake/hyflowConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/hyflowConfig.cmake INSTALL_DESTINATION ${HYFLOW_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/hyflowConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/hyflowConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/hyflowConfigVersion.cmake
  ${CMAKE_CURRENT_SOURCE_DIR}/cmake/FindCAF.cmake
  ${CMAKE_CURRENT_SOURCE_DIR}/cmake/FindNCCL.cmake
  ${CMAKE_CURRENT_SOURCE_DIR}/cmake/FindCppHttplib.cmake
  DESTINATION ${HYFLOW_CMAKE_DIR})
