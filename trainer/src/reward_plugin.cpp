// custom_reward_function.path: reward functions from a shared library (hyflow's form of verl's
// Python file with a compute_score function).
#include <hyflow/core/shared_library.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/ppo_config.hpp>
#include <hyflow/trainer/reward_manager.hpp>

namespace hyflow::trainer {

void load_reward_plugin(const std::string& path) {
  // An unresolved symbol fails here, not in the middle of training; the library stays loaded
  // for the life of the process, since the registered functions point into it.
  load_shared_library(path, "reward plugin");
}

std::string load_custom_reward_function(const RewardSection& reward) {
  const std::string& name = reward.custom_function_name;
  if (!reward.custom_function_path) return name == "compute_score" ? "default" : name;
  const std::string& plugin = *reward.custom_function_path;
  const bool batch = reward.reward_manager == "batch";
  try {
    load_reward_plugin(plugin);
    if (batch) (void)get_batch_compute_score(name);
    else (void)algos::reward_score::get_compute_score(name);
  } catch (const ValueError& e) {
    throw ValueError("config key 'custom_reward_function.path': " + std::string(e.what()));
  } catch (const KeyError&) {
    throw KeyError("config key 'custom_reward_function.name': '" + name + "' is not a registered " +
                   (batch ? "batch " : "") + "reward function after loading '" + plugin + "'");
  }
  return name;
}

}  // namespace hyflow::trainer
