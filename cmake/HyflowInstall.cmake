# Installs the exported targets and hyflowConfig.cmake so that another CMake project can
#   find_package(hyflow REQUIRED)
#   target_link_libraries(app PRIVATE hyflow::dataproto)
include(CMakePackageConfigHelpers)

set(HYFLOW_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/hyflow)
install(EXPORT hyflowTargets NAMESPACE hyflow:: DESTINATION ${HYFLOW_CMAKE_DIR})
get_property(HYFLOW_EXPORTED_MODULES GLOBAL PROPERTY HYFLOW_EXPORTED_MODULES)
configure_package_config_file(cmake/hyflowConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/hyflowConfig.cmake INSTALL_DESTINATION ${HYFLOW_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/hyflowConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/hyflowConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/hyflowConfigVersion.cmake
  ${CMAKE_CURRENT_SOURCE_DIR}/cmake/FindCAF.cmake
  DESTINATION ${HYFLOW_CMAKE_DIR})
