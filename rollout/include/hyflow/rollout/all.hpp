#pragma once
// Everything of hyflow::rollout.
#include <hyflow/rollout/rollout_backend.hpp>
#include <hyflow/rollout/rollout_registry.hpp>
#include <hyflow/rollout/server_rollout.hpp>
