// The in-process launcher: spawns one detached worker actor per rank on the Runtime's actor
// system and constructs the worker class on each (hf_init); a failing constructor stops them all.
#include "in_process_launcher.hpp"

#include "runtime_core.hpp"
#include "worker_actor.hpp"

#include <hyflow/actors/caf_inspect.hpp>
#include <hyflow/actors/caf_protocol.hpp>

#include <caf/all.hpp>

namespace hyflow::actors::detail {

using caf_protocol::init_atom;
using caf_protocol::worker_actor;

std::vector<WorkerRef> InProcessLauncher::launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) {
  auto core = core_.lock();
  if (!core) throw RuntimeStoppedError("__init__");
  auto& sys = core->system("__init__");
  std::vector<worker_actor> actors;
  for (size_t i = 0; i < envs.size(); ++i) {
    actors.push_back(caf_protocol::spawn_worker(sys));
    core->live->track(caf::actor_cast<caf::abstract_actor*>(actors.back()));
  }
  {
    std::lock_guard lock(core->mutex);
    for (auto& a : actors) core->launched.push_back(a.address());
  }
  caf::scoped_actor self{sys};
  const std::string spec_json = spec.to_json().dump();
  std::vector<decltype(self->request(actors[0], caf::infinite, init_atom::value, spec_json, spec_json))> pending;
  for (size_t i = 0; i < envs.size(); ++i)
    pending.push_back(self->request(actors[i], caf::infinite, init_atom::value, spec_json, envs[i].to_json().dump()));
  std::exception_ptr failure;
  for (size_t i = 0; i < pending.size(); ++i)
    pending[i].receive([](std::string&) {},
                       [&](caf::error& e) {
                         if (failure) return;
                         const std::string msg = context_string(e, 1).empty()
                                                     ? sys.render(e)
                                                     : context_string(e, 0) + ": " + context_string(e, 1);
                         failure = std::make_exception_ptr(
                             CallError("__init__", static_cast<int>(i), msg,
                                       "constructing worker type '" + spec.type + "' failed on rank " +
                                           std::to_string(i) + " of " + std::to_string(envs.size()) + ": " + msg));
                       });
  if (failure) {
    for (auto& a : actors) self->send_exit(a, caf::exit_reason::user_shutdown);
    std::rethrow_exception(failure);
  }
  std::vector<WorkerRef> out;
  for (size_t i = 0; i < envs.size(); ++i) out.push_back(caf_protocol::make_worker_ref(actors[i], spec, envs[i]));
  return out;
}

}  // namespace hyflow::actors::detail
