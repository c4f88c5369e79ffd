#pragma once
// A worker group seen from CAF (only CAF translation units include this header):
//
//   // asynchronous call from an event-based actor; the handlers run in `self`'s context
//   group.request(self, &Critic::compute_values, batch)
//       .then([=](DataProto values) { ... }, [=](caf::error& e) { ... });
//
//   // the group as a CAF actor: ("hf_call", method, args) -> Value, one group call each
//   hyflow::group_actor critic = hyflow::spawn_group_actor(system, critic_group);
//   self->request(critic, caf::infinite, hyflow::call_atom::value, "compute_values", args)...
//
// A failed call arrives as a caf::error of the "hyflow" category (caf_protocol::errc) whose
// context is (exception class, message, method, rank): error_kind and error_message read it.

#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/actors/worker_group.hpp>

#include <caf/actor_system.hpp>
#include <caf/error.hpp>
#include <caf/typed_actor.hpp>

#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace hyflow::actors {

/// A worker group as a typed CAF actor: each ("hf_call", method, args) runs one group call
/// (dispatch, every rank, collect, un-pad) and answers when it completes; the actor keeps
/// serving other requests meanwhile. Calls may overlap, as with WorkerGroup::call_then.
using group_actor =
    caf::typed_actor<caf::replies_to<caf_protocol::call_atom, std::string, std::vector<Value>>::with<Value>>;

/// Spawns a group actor on `system` (an actor system of this process, usually the one of the
/// actors that talk to it). It holds a copy of `group` until its last handle is gone; after the
/// group's Runtime has stopped, its calls fail with errc::runtime_stopped.
group_actor spawn_group_actor(caf::actor_system& system, WorkerGroup group);

/// A group call's exception as a caf::error of the "hyflow" category (see errc), with the
/// context (exception class, message, method, rank).
caf::error to_caf_error(std::exception_ptr error);
/// The exception class a "hyflow" error carries: the worker's ("std::runtime_error",
/// "ValueError") for a method that threw, else the runtime's ("WorkerDiedError",
/// "RuntimeStoppedError", "BindError", ...); empty for errors of other categories.
std::string error_kind(const caf::error& e);
/// The message a "hyflow" error carries (the exception's what()); empty for other categories.
std::string error_message(const caf::error& e);

namespace detail {
template <class F>
struct first_parameter : first_parameter<decltype(&F::operator())> {};
template <class C, class Ret, class A>
struct first_parameter<Ret (C::*)(A) const> {
  using type = A;
};
template <class C, class Ret, class A>
struct first_parameter<Ret (C::*)(A)> {
  using type = A;
};
template <class Ret, class A>
struct first_parameter<Ret (*)(A)> {
  using type = A;
};

/// Converts the reply to the result handler's parameter type (as TypedResult<R> does); a
/// conversion that fails goes to the error handler instead.
template <class R, class F, class G>
auto result_handler(F on_result, G on_error, std::string method) {
  return [on_result = std::move(on_result), on_error = std::move(on_error),
          method = std::move(method)](Value& reply) mutable {
    if constexpr (std::is_invocable_v<F&>) {
      on_result();
    } else {
      using T = std::decay_t<typename first_parameter<F>::type>;
      std::optional<T> value;
      try {
        value.emplace(TypedResult<R>(std::move(reply), method).operator T());
      } catch (...) {
        caf::error e = to_caf_error(std::current_exception());
        on_error(e);
        return;
      }
      on_result(std::move(*value));
    }
  };
}
}  // namespace detail

/// What WorkerGroup::request returns: CAF's response handle of the call, with handlers that
/// take the method's result type. then() runs them in arrival order, await() suspends the
/// actor's other messages until this reply is in (LIFO among awaits), receive() is for
/// blocking actors (scoped_actor).
template <class R, class Handle>
class GroupResponse {
 public:
  GroupResponse(Handle handle, std::string method) : handle_(std::move(handle)), method_(std::move(method)) {}

  template <class F, class G>
  void then(F on_result, G on_error) {
    handle_.then(detail::result_handler<R>(std::move(on_result), on_error, method_),
                 [on_error](caf::error& e) mutable { on_error(e); });
  }
  template <class F, class G>
  void await(F on_result, G on_error) {
    handle_.await(detail::result_handler<R>(std::move(on_result), on_error, method_),
                  [on_error](caf::error& e) mutable { on_error(e); });
  }
  template <class F, class G>
  void receive(F on_result, G on_error) {
    handle_.receive(detail::result_handler<R>(std::move(on_result), on_error, method_),
                    [on_error](caf::error& e) mutable { on_error(e); });
  }

 private:
  Handle handle_;
  std::string method_;
};

namespace detail {
/// WorkerGroup::request: a short-lived group actor on the caller's own actor system carries
/// the call, so the reply is an ordinary CAF response to `self`.
template <class Self>
struct GroupRequest {
  template <class R>
  static auto make(Self* self, const WorkerGroup& group, std::string method, std::vector<Value> args) {
    auto carrier = spawn_group_actor(self->system(), group);
    auto handle = self->request(carrier, caf::infinite, caf_protocol::call_atom::value, method, std::move(args));
    return GroupResponse<R, decltype(handle)>(std::move(handle), std::move(method));
  }
};
}  // namespace detail

}  // namespace hyflow::actors

// Short names in hyflow:: for what embedding applications write.
namespace hyflow {
using actors::error_kind;
using actors::error_message;
using actors::group_actor;
using actors::spawn_group_actor;
using call_atom = actors::caf_protocol::call_atom;
}  // namespace hyflow
