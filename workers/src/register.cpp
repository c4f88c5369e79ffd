#include <hyflow/workers/register.hpp>

#include <hyflow/actors/worker_registry.hpp>
#include <hyflow/workers/actor_rollout_ref_worker.hpp>
#include <hyflow/workers/critic_worker.hpp>
#include <hyflow/workers/reward_model_worker.hpp>

#include <mutex>

namespace hyflow::workers {

void register_workers() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_worker_type<ActorRolloutRefWorker>("ActorRolloutRefWorker");
    register_worker_type<CriticWorker>("CriticWorker");
    register_worker_type<RewardModelWorker>("RewardModelWorker");
  });
}

}  // namespace hyflow::workers
