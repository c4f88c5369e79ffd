#pragma once
// Everything of hyflow::workers.

#include <hyflow/workers/actor_rollout_ref_worker.hpp>
#include <hyflow/workers/config.hpp>
#include <hyflow/workers/critic_worker.hpp>
#include <hyflow/workers/micro_batches.hpp>
#include <hyflow/workers/register.hpp>
#include <hyflow/workers/reward_model_worker.hpp>
