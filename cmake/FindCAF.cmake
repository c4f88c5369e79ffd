# FindCAF: the C++ Actor Framework 0.17.x as Debian ships it (no CMake package file).
#
# Imported targets: caf::core, caf::io, caf::openssl (the latter when libcaf_openssl exists).
# Variables: CAF_FOUND, CAF_VERSION (e.g. 0.17.6), CAF_INCLUDE_DIR.
# CAF 0.18+ has a different API; this project needs 0.17.x, so other versions are rejected.

find_package(Threads REQUIRED)
find_path(CAF_INCLUDE_DIR caf/all.hpp)
if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_v REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX MATCH "[0-9]+$" _caf_num "${_caf_v}")
  math(EXPR _major "${_caf_num} / 10000")
  math(EXPR _minor "(${_caf_num} / 100) % 100")
  math(EXPR _patch "${_caf_num} % 100")
  set(CAF_VERSION "${_major}.${_minor}.${_patch}")
endif()
find_library(CAF_CORE_LIBRARY NAMES caf_core)
find_library(CAF_IO_LIBRARY NAMES caf_io)
find_library(CAF_OPENSSL_LIBRARY NAMES caf_openssl)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY
  VERSION_VAR CAF_VERSION)
if(CAF_FOUND AND NOT CAF_VERSION VERSION_LESS 0.18)
  message(FATAL_ERROR "hyflow needs CAF 0.17.x, found ${CAF_VERSION} in ${CAF_INCLUDE_DIR}")
endif()

if(CAF_FOUND AND NOT TARGET caf::core)
  add_library(caf::core UNKNOWN IMPORTED)
  set_target_properties(caf::core PROPERTIES IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}" INTERFACE_LINK_LIBRARIES Threads::Threads)
  add_library(caf::io UNKNOWN IMPORTED)
  set_target_properties(caf::io PROPERTIES IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
    INTERFACE_LINK_LIBRARIES caf::core)
  if(CAF_OPENSSL_LIBRARY)
    add_library(caf::openssl UNKNOWN IMPORTED)
    set_target_properties(caf::openssl PROPERTIES IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
      INTERFACE_LINK_LIBRARIES caf::io)
  endif()
endif()
