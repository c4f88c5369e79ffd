#pragma once
// The built-in "hf" rollout backend (decode_rollout.cpp).

#include <hyflow/rollout/rollout_backend.hpp>

#include <memory>

namespace hyflow::rollout::detail {

/// The decode engine on the context's model, in this process.
std::unique_ptr<RolloutBackend> make_decode_rollout(const RolloutContext& context);

}  // namespace hyflow::rollout::detail
