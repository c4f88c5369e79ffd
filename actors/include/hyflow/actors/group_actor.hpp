#pragma once
// A worker group seen from CAF (only CAF translation units include this header):
//
//   // asynchronous call from an event-based actor, in CAF's order (destination, timeout,
//   // message); the handlers run in `self`'s context
//   hyflow::request(self, critic, std::chrono::seconds(30), &Critic::compute_values, batch)
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
#include <caf/duration.hpp>
#include <caf/error.hpp>
#include <caf/sec.hpp>
#include <caf/typed_actor.hpp>

#include <chrono>
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

/// The timeout of a request: a std::chrono duration, or caf::infinite (none).
class RequestTimeout {
 public:
  RequestTimeout(caf::infinite_t) {}  // NOLINT(google-explicit-constructor): reads as CAF's
  template <class Rep, class Period>
  RequestTimeout(std::chrono::duration<Rep, Period> d)  // NOLINT(google-explicit-constructor)
      : ms_(std::chrono::ceil<std::chrono::milliseconds>(d)) {}
  /// Milliseconds, none for caf::infinite.
  std::optional<std::chrono::milliseconds> milliseconds() const { return ms_; }

 private:
  std::optional<std::chrono::milliseconds> ms_;
};

namespace detail {
/// The caf::error of a request whose timeout passed: errc::call_timeout with the context
/// ("CallTimeoutError", message naming the method and the timeout, method, -1).
caf::error request_timeout_error(const std::string& method, std::chrono::milliseconds timeout);
/// A short-lived group actor that runs each call with `options` (a request's deadline).
group_actor spawn_group_carrier(caf::actor_system& system, WorkerGroup group, CallOptions options);

/// The error handler of a request: CAF's own request timeout becomes the typed hyflow error.
template <class G>
auto error_handler(G on_error, std::string method, std::optional<std::chrono::milliseconds> timeout) {
  return [on_error = std::move(on_error), method = std::move(method), timeout](caf::error& e) mutable {
    if (timeout && e == caf::sec::request_timeout) {
      caf::error typed = request_timeout_error(method, *timeout);
      on_error(typed);
    } else {
      on_error(e);
    }
  };
}

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
  GroupResponse(Handle handle, std::string method, std::optional<std::chrono::milliseconds> timeout = std::nullopt)
      : handle_(std::move(handle)), method_(std::move(method)), timeout_(timeout) {}

  template <class F, class G>
  void then(F on_result, G on_error) {
    handle_.then(detail::result_handler<R>(std::move(on_result), on_error, method_),
                 detail::error_handler(std::move(on_error), method_, timeout_));
  }
  template <class F, class G>
  void await(F on_result, G on_error) {
    handle_.await(detail::result_handler<R>(std::move(on_result), on_error, method_),
                  detail::error_handler(std::move(on_error), method_, timeout_));
  }
  template <class F, class G>
  void receive(F on_result, G on_error) {
    handle_.receive(detail::result_handler<R>(std::move(on_result), on_error, method_),
                    detail::error_handler(std::move(on_error), method_, timeout_));
  }

 private:
  Handle handle_;
  std::string method_;
  std::optional<std::chrono::milliseconds> timeout_;
};

namespace detail {
/// WorkerGroup::request and request(): a short-lived group actor on the caller's own actor
/// system carries the call, so the reply is an ordinary CAF response to `self`. With a
/// timeout, the group call has it as its deadline (the collector names the ranks that have not
/// answered) and the CAF request has it as its timeout.
template <class Self>
struct GroupRequest {
  template <class R>
  static auto make(Self* self, const WorkerGroup& group, std::string method, std::vector<Value> args,
                   std::optional<std::chrono::milliseconds> timeout) {
    auto carrier = spawn_group_carrier(self->system(), group, CallOptions{.deadline = timeout});
    auto handle = timeout ? self->request(carrier, *timeout, caf_protocol::call_atom::value, method, std::move(args))
                          : self->request(carrier, caf::infinite, caf_protocol::call_atom::value, method,
                                          std::move(args));
    return GroupResponse<R, decltype(handle)>(std::move(handle), std::move(method), timeout);
  }
  template <class W, class R, class Params, class Fn, class... A>
  static auto typed(Self* self, const WorkerGroup& group, const RequestTimeout& timeout, Fn fn, A&&... args) {
    return group.template typed_request<Self, W, R, Params>(self, timeout.milliseconds(), fn,
                                                           std::forward<A>(args)...);
  }
};
}  // namespace detail

/// A group call from a CAF actor in CAF's order, `self->request(destination, timeout, message)`:
///   hyflow::request(self, critic, std::chrono::seconds(30), &Critic::compute_values, batch)
///       .then([=](DataProto values) { ... }, [=](caf::error& e) { ... });
/// Arguments are checked at compile time as for WorkerGroup::call. When `timeout` passes first,
/// the error handler gets a "hyflow" error with errc::call_timeout (error_kind
/// "CallTimeoutError", the method in its context); caf::infinite waits as long as it takes.
template <class Self, class W, class R, class... P, class... A>
auto request(Self* self, const WorkerGroup& group, RequestTimeout timeout, R (W::*fn)(P...), A&&... args) {
  return detail::GroupRequest<Self>::template typed<W, R, std::tuple<P...>>(self, group, timeout, fn,
                                                                              std::forward<A>(args)...);
}
template <class Self, class W, class R, class... P, class... A>
auto request(Self* self, const WorkerGroup& group, RequestTimeout timeout, R (W::*fn)(P...) const, A&&... args) {
  return detail::GroupRequest<Self>::template typed<W, R, std::tuple<P...>>(self, group, timeout, fn,
                                                                              std::forward<A>(args)...);
}
/// By name; the result handler gets a Value (or anything TypedResult<Value> converts to).
template <class Self, class... A>
auto request(Self* self, const WorkerGroup& group, RequestTimeout timeout, const std::string& method, A&&... args) {
  return detail::GroupRequest<Self>::template make<Value>(
      self, group, method, std::vector<Value>{to_value(std::forward<A>(args))...}, timeout.milliseconds());
}

}  // namespace hyflow::actors

// Short names in hyflow:: for what embedding applications write.
namespace hyflow {
using actors::error_kind;
using actors::error_message;
using actors::group_actor;
using actors::request;
using actors::RequestTimeout;
using actors::spawn_group_actor;
using call_atom = actors::caf_protocol::call_atom;
}  // namespace hyflow
