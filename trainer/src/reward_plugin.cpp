// custom_reward_function.path: reward functions from a shared library (hyflow's form of verl's
// Python file with a compute_score function).
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/reward_manager.hpp>

#include <dlfcn.h>

#include <filesystem>

namespace hyflow::trainer {

void load_reward_plugin(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw ValueError("reward plugin '" + path + "' does not exist or is not a file");
  // RTLD_NOW: an unresolved symbol fails here, not in the middle of training. The handle is
  // kept for the life of the process: the registered functions point into the library.
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    throw ValueError("cannot load reward plugin '" + path + "': " + (why ? why : "unknown error"));
  }
}

}  // namespace hyflow::trainer
