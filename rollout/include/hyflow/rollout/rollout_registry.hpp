#pragma once
// The registry of rollout backends, keyed by actor_rollout_ref.rollout.name. Built in: "hf",
// the decode engine running the policy in the worker's own process (verl's name for its
// in-process Hugging Face rollout). A backend of your own is a RolloutBackend subclass and one
// register_rollout_backend call (from a static initializer of a plugin, or at program start).

#include <hyflow/rollout/rollout_backend.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::rollout {

using RolloutFactory = std::function<std::unique_ptr<RolloutBackend>(const RolloutContext&)>;

/// Registers (or replaces) the backend `name`.
void register_rollout_backend(const std::string& name, RolloutFactory factory);
bool has_rollout_backend(const std::string& name);
/// Registered names, sorted.
std::vector<std::string> rollout_backend_names();
/// The backend `name` built for `context`; KeyError "unknown rollout backend 'x' ...; did you
/// mean 'y'?" listing the registered names otherwise.
std::unique_ptr<RolloutBackend> make_rollout_backend(const std::string& name, const RolloutContext& context);

}  // namespace hyflow::rollout
