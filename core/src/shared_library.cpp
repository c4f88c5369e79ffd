#include <hyflow/core/error.hpp>
#include <hyflow/core/shared_library.hpp>

#include <dlfcn.h>

#include <filesystem>

namespace hyflow {

void load_shared_library(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw ValueError(what + " '" + path + "' does not exist or is not a file");
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    throw ValueError("cannot load " + what + " '" + path + "': " + (why ? why : "unknown error"));
  }
}

}  // namespace hyflow
