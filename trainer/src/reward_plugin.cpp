// custom_reward_function.path: reward functions from a shared library (hyflow's form of verl's
// Python file with a compute_score function).
#include <hyflow/core/shared_library.hpp>
#include <hyflow/trainer/reward_manager.hpp>

namespace hyflow::trainer {

void load_reward_plugin(const std::string& path) {
  // An unresolved symbol fails here, not in the middle of training; the library stays loaded
  // for the life of the process, since the registered functions point into it.
  load_shared_library(path, "reward plugin");
}

}  // namespace hyflow::trainer
