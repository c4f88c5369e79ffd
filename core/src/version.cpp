// The version and commit CMake wrote into the generated build-info header (core/CMakeLists.txt).
#include <hyflow/core/version.hpp>

#include "hyflow_build_info.hpp"

namespace hyflow {

const char* version() {
  return HYFLOW_BUILD_VERSION;
}

const char* git_commit() {
  return HYFLOW_BUILD_GIT_COMMIT;
}

}  // namespace hyflow
