#pragma once
// Registers the role workers in the WorkerRegistry under their class names
// ("ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"), so groups and remote
// nodes build them from {type name, init args}. Idempotent; call before creating groups.

namespace hyflow::workers {

void register_workers();

}  // namespace hyflow::workers
