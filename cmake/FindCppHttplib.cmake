# FindCppHttplib: cpp-httplib (Debian's libcpp-httplib-dev, 0.11), the HTTP server of hyflow::serve.
#
# Imported target: CppHttplib::CppHttplib. Debian builds it as a shared library whose header must be
# compiled with the same CPPHTTPLIB_*_SUPPORT macros (OpenSSL, zlib, brotli): pkg-config's Cflags carry them.
find_package(PkgConfig REQUIRED)
pkg_check_modules(CPP_HTTPLIB QUIET IMPORTED_TARGET cpp-httplib)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CppHttplib REQUIRED_VARS CPP_HTTPLIB_FOUND VERSION_VAR CPP_HTTPLIB_VERSION)
if(CppHttplib_FOUND AND NOT TARGET CppHttplib::CppHttplib)
  add_library(CppHttplib::CppHttplib INTERFACE IMPORTED)
  target_link_libraries(CppHttplib::CppHttplib INTERFACE PkgConfig::CPP_HTTPLIB)
endif()
