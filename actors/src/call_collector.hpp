#pragma once
// Internal to the actors module: the collector, one actor per group (call_collector.cpp). The
// group's transport submits each call to it; it sends each rank its request, monitors the
// workers and runs the watchdog.

#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/actors/detail/pending_call.hpp>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<hyflow::actors::detail::PendingCall>)  // in-process only

namespace hyflow::actors::detail {

/// To a collector: (submit, shared_ptr<PendingCall>) runs a call on its ranks.
using submit_atom = caf::atom_constant<caf::atom("hf_submit")>;
/// To a collector: (kill, rank) kills that rank's worker.
using kill_atom = caf::atom_constant<caf::atom("hf_kill")>;

/// Spawns the collector (detached) of a group of `workers` named `names`, of job `job` (empty:
/// none); it clears (*alive)[rank] when that rank's worker dies.
caf::actor spawn_collector(caf::actor_system& sys, std::vector<caf_protocol::worker_actor> workers,
                           std::vector<std::string> names, std::string job,
                           std::shared_ptr<std::vector<std::atomic<bool>>> alive);

}  // namespace hyflow::actors::detail
