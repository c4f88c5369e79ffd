#pragma once
// The worker protocol on CAF, for code that places workers itself (the cluster layer's
// caf-node and remote launcher). Only CAF translation units include this header.
//
//   worker  <- ("hf_init", spec json, env json)        -> worker name   (constructs the class)
//   worker  <- ("hf_call", method, std::vector<Value>) -> Value         (runs one method)
//
// Errors come back in the "hyflow" error category with context (exception kind, message).

#include <hyflow/actors/caf_inspect.hpp>
#include <hyflow/actors/runtime.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <string>
#include <vector>

namespace hyflow::actors::caf_protocol {

using init_atom = caf::atom_constant<caf::atom("hf_init")>;
using call_atom = caf::atom_constant<caf::atom("hf_call")>;

using worker_actor = caf::typed_actor<caf::replies_to<init_atom, std::string, std::string>::with<std::string>,
                                      caf::replies_to<call_atom, std::string, std::vector<Value>>::with<Value>>;

/// Error codes of the "hyflow" category. A worker's errors carry the context (exception
/// class, message); a group call's (group_actor.hpp) carry (class, message, method, rank).
enum class errc : uint8_t {
  method_failed = 1,    ///< a method threw (CallError)
  init_failed = 2,      ///< a worker's constructor threw
  worker_exit = 3,      ///< a worker died (WorkerDiedError)
  call_timeout = 4,     ///< a group call passed its deadline (CallTimeoutError)
  runtime_stopped = 5,  ///< the group's Runtime was destroyed (RuntimeStoppedError)
  call_failed = 6,      ///< a group call was refused (unknown method, bad arguments, ...)
};
std::string to_string(errc code);

/// Registers what every node needs: DataProto and Value message types and the "hyflow" error
/// category. No actor type is registered: CAF's remote spawn would create workers for any
/// connected peer; workers are spawned only by a node manager for an authenticated
/// controller (spawn_worker).
void register_types(caf::actor_system_config& cfg);

/// Spawns an uninitialized worker actor (detached: its own thread).
worker_actor spawn_worker(caf::actor_system& sys);

/// Wraps a worker actor (local, or a proxy of a remote one) that has been initialized with
/// `spec` and `env`, for WorkerGroup (through a WorkerLauncher). `job`: the id of the job
/// (controller session) a remote launcher started the worker for, also sent to the worker as
/// "JOB" in its env message; large payloads of the group's calls travel under that job's data
/// plane token (hyflow/cluster/data_plane.hpp). Empty: none.
WorkerRef make_worker_ref(worker_actor actor, WorkerSpec spec, WorkerEnv env, std::string job = {});

/// The actor system a Runtime runs on.
caf::actor_system& system_of(Runtime& runtime);

}  // namespace hyflow::actors::caf_protocol
