#pragma once
// The built-in "server" rollout backend (server_rollout.cpp).

#include <hyflow/rollout/rollout_backend.hpp>

#include <memory>

namespace hyflow::rollout::detail {

/// A serve::EngineLoop + serve::Server on the context's model, called over loopback HTTP.
std::unique_ptr<RolloutBackend> make_server_rollout(const RolloutContext& context);

}  // namespace hyflow::rollout::detail
