// A WorkerGroup as a CAF actor (group_actor.hpp): group calls for CAF requests, and the
// "hyflow" error category of their failures.
#include <hyflow/actors/group_actor.hpp>

#include "worker_actor.hpp"

#include <hyflow/actors/caf_inspect.hpp>
#include <hyflow/actors/caf_protocol.hpp>

#include <caf/all.hpp>

#include <map>

namespace hyflow::actors {

namespace detail {
namespace {
using caf_protocol::call_atom;
using done_atom = caf::atom_constant<caf::atom("hf_done")>;

struct group_state {
  std::optional<WorkerGroup> group;
  uint64_t next_id = 0;
  std::map<uint64_t, caf::typed_response_promise<Value>> promises;
  static inline const char* name = "hyflow.group";
};

caf::error group_error(caf_protocol::errc code, std::string kind, std::string what, std::string method, int rank) {
  return {static_cast<uint8_t>(code), caf::atom("hyflow"),
          caf::make_message(std::move(kind), std::move(what), std::move(method), static_cast<int32_t>(rank))};
}

/// Runs group calls for CAF requests; answers from the group's completion, which it is sent
/// as a message (a response promise is delivered on the actor's own thread only).
caf::behavior group_behavior(caf::stateful_actor<group_state>* self, WorkerGroup group, CallOptions options) {
  self->state.group.emplace(std::move(group));
  return {
      [=](call_atom, std::string& method, std::vector<Value>& args) -> caf::result<Value> {
        auto& st = self->state;
        const uint64_t id = st.next_id++;
        auto me = caf::actor_cast<caf::actor>(self);  // alive until the answer is in
        try {
          st.group->call_then(
              method, std::move(args), [me, id](Value v) { caf::anon_send(me, done_atom::value, id, std::move(v)); },
              [me, id](std::exception_ptr e) { caf::anon_send(me, done_atom::value, id, to_caf_error(e)); },
              options);
        } catch (...) {
          return to_caf_error(std::current_exception());
        }
        auto promise = self->make_response_promise<Value>();
        st.promises.emplace(id, promise);
        return promise;
      },
      [=](done_atom, uint64_t id, Value& v) {
        auto it = self->state.promises.find(id);
        if (it == self->state.promises.end()) return;
        it->second.deliver(std::move(v));
        self->state.promises.erase(it);
      },
      [=](done_atom, uint64_t id, caf::error& e) {
        auto it = self->state.promises.find(id);
        if (it == self->state.promises.end()) return;
        it->second.deliver(std::move(e));
        self->state.promises.erase(it);
      },
  };
}
}  // namespace
}  // namespace detail

group_actor spawn_group_actor(caf::actor_system& system, WorkerGroup group) {
  return caf::actor_cast<group_actor>(system.spawn(detail::group_behavior, std::move(group), CallOptions{}));
}

namespace detail {
group_actor spawn_group_carrier(caf::actor_system& system, WorkerGroup group, CallOptions options) {
  return caf::actor_cast<group_actor>(system.spawn(group_behavior, std::move(group), std::move(options)));
}

caf::error request_timeout_error(const std::string& method, std::chrono::milliseconds timeout) {
  return group_error(caf_protocol::errc::call_timeout, "CallTimeoutError",
                     "method '" + method + "': no reply within the request's timeout of " +
                         std::to_string(timeout.count()) + " ms",
                     method, -1);
}
}  // namespace detail

caf::error to_caf_error(std::exception_ptr error) {
  using caf_protocol::errc;
  using detail::group_error;
  try {
    std::rethrow_exception(error);
  } catch (const RuntimeStoppedError& e) {
    return group_error(errc::runtime_stopped, "RuntimeStoppedError", e.what(), e.method(), e.rank());
  } catch (const CallTimeoutError& e) {
    return group_error(errc::call_timeout, "CallTimeoutError", e.what(), e.method(), e.rank());
  } catch (const WorkerDiedError& e) {
    return group_error(errc::worker_exit, "WorkerDiedError", e.what(), e.method(), e.rank());
  } catch (const CallError& e) {
    return group_error(errc::method_failed, e.kind().empty() ? "CallError" : e.kind(), e.what(), e.method(),
                       e.rank());
  } catch (const BindError& e) {
    return group_error(errc::call_failed, "BindError", e.what(), e.method(), e.rank());
  } catch (const std::exception& e) {
    return group_error(errc::call_failed, detail::kind_of(e), e.what(), "", -1);
  } catch (...) {
    return group_error(errc::call_failed, "unknown", "an exception that is not a std::exception", "", -1);
  }
}

std::string error_kind(const caf::error& e) {
  return e.category() == caf::atom("hyflow") ? detail::context_string(e, 0) : std::string();
}

std::string error_message(const caf::error& e) {
  return e.category() == caf::atom("hyflow") ? detail::context_string(e, 1) : std::string();
}

}  // namespace hyflow::actors
