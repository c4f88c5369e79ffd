#pragma once
// The application's own CAF actors as the workers of a group (only CAF translation units
// include this header). The actor stays as it is; it answers its own messages:
//
//   caf::behavior scorer(caf::event_based_actor*, double target) {
//     return {[=](score_atom, DataProto batch) -> DataProto { ... }};
//   }
//
//   hyflow::ActorWorkers scorers(runtime, "Scorer",
//                                [](caf::actor_system& sys, const hyflow::WorkerEnv&) { return sys.spawn(scorer, 1.0);
//                                });
//   scorers.method<score_atom, DataProto(DataProto)>("score", {.dispatch = hyflow::Dispatch::DP_COMPUTE_PROTO});
//   hyflow::WorkerGroup reward = scorers.make_group(hyflow::ResourcePool({2}));
//   DataProto scored = reward.call("score", batch);   // or request(self, "score", ...), typed actors, ...
//
// A group call of "score" sends (score_atom, chunk) to each rank's actor and takes its reply as
// that rank's result; dispatch, collect, deadlines and futures work as for any worker class.
// Each rank's actor is reached through a small adapter actor on the Runtime's actor system
// (event-based: no thread of its own), linked to it: the group's shutdown (or kill_worker)
// ends the actor, and the actor's end (or failure) is the worker's death for the group.

#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/actors/error.hpp>
#include <hyflow/actors/group_actor.hpp>
#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker_group.hpp>

#include <caf/all.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace hyflow::actors {

namespace detail {
/// Runs one method on a rank's own actor: converts the arguments, requests the actor, and
/// delivers its reply (as a Value) or its error to `promise`.
using ActorMethod = std::function<void(caf::event_based_actor* self, const caf::actor& target, std::vector<Value>& args,
                                       caf::response_promise promise)>;
using ActorMethods = std::map<std::string, ActorMethod>;

/// A failure before the actor was asked (wrong argument count or type), as the worker
/// protocol reports a method's exception.
caf::error actor_method_error(std::exception_ptr error);

template <class Tag>
auto message_tag() {
  if constexpr (requires { Tag::value; })
    return Tag::value;  // atom_constant: the atom itself
  else
    return Tag{};
}

template <class Tag, class R, class... P, size_t... I>
ActorMethod bind_actor_method(std::string name, std::index_sequence<I...>) {
  return [name](caf::event_based_actor* self, const caf::actor& target, std::vector<Value>& args,
                caf::response_promise promise) {
    std::optional<std::tuple<std::decay_t<P>...>> converted;
    try {
      check_arity(name, sizeof...(P), args.size());
      converted.emplace(
          from_value<std::decay_t<P>>(std::move(args[I]), "argument " + std::to_string(I) + " of '" + name + "'")...);
    } catch (...) {
      promise.deliver(actor_method_error(std::current_exception()));
      return;
    }
    auto handle = self->request(target, caf::infinite, message_tag<Tag>(), std::move(std::get<I>(*converted))...);
    auto on_error = [promise](caf::error& e) mutable { promise.deliver(std::move(e)); };
    if constexpr (std::is_void_v<R>)
      handle.then([promise]() mutable { promise.deliver(Value()); }, on_error);
    else
      handle.then([promise](std::decay_t<R>& r) mutable { promise.deliver(to_value(std::move(r))); }, on_error);
  };
}

template <class Sig>
struct actor_signature;
template <class R, class... P>
struct actor_signature<R(P...)> {
  template <class Tag>
  static ActorMethod bind(std::string name) {
    return bind_actor_method<Tag, R, P...>(std::move(name), std::index_sequence_for<P...>{});
  }
  static MethodEntry entry(std::string name, MethodOptions options) {
    MethodEntry e;
    e.name = name;
    e.options = std::move(options);
    e.arity = sizeof...(P);
    e.parameter_types = {type_label<P>()...};
    e.result_type = type_label<R>();
    e.returns_dataproto = std::is_same_v<std::decay_t<R>, DataProto>;
    e.pointer_type = typeid(R(*)(P...));  // a signature, no member: matched by name and types
    e.invoke = [name](Worker&, std::vector<Value>&) -> Value {
      throw NotSupportedError("method '" + name + "' is served by an actor of the application (ActorWorkers)");
    };
    return e;
  }
};

/// Registers (once per process) the worker type `type` with these declarations, or returns the
/// table registered before under that name when its declarations are the same; ValueError when
/// the name is taken by a worker class or by other declarations.
std::shared_ptr<const MethodTableBase> register_actor_worker_type(const std::string& type,
                                                                  const std::vector<MethodEntry>& entries);

/// The launcher of ActorWorkers: spawns the rank's actor through the factory and its adapter.
std::shared_ptr<WorkerLauncher> make_actor_launcher(
    caf::actor_system& system, std::string type,
    std::function<caf::actor(caf::actor_system&, const WorkerEnv&)> factory,
    std::shared_ptr<const ActorMethods> methods);
}  // namespace detail

/// Own CAF actors as the workers of groups: a worker type whose ranks are actors made by a
/// factory, and whose methods are messages those actors already answer.
class ActorWorkers {
 public:
  /// `type` names the worker type (once per process for one set of declarations); `factory`
  /// makes the actor of one rank: F(caf::actor_system&, const WorkerEnv&) returning any actor
  /// handle (caf::actor, a typed_actor, ...), spawned on the given system (the Runtime's).
  template <class F>
  ActorWorkers(Runtime& runtime, std::string type, F factory)
      : system_(&caf_protocol::system_of(runtime)), runtime_(&runtime), type_(std::move(type)) {
    factory_ = [f = std::move(factory)](caf::actor_system& sys, const WorkerEnv& env) {
      return caf::actor_cast<caf::actor>(f(sys, env));
    };
  }

  /// Declares method `name`: a call sends (Tag, P...) to the rank's actor (Tag an atom
  /// constant: its atom is sent), whose reply R is that rank's result; `options` as in
  /// MethodTable::add. Before the first group only (ValueError after).
  template <class Tag, class Sig>
  ActorWorkers& method(std::string name, MethodOptions options = {}) {
    if (launcher_)
      throw ValueError("ActorWorkers '" + type_ + "': method '" + name + "' declared after the first group");
    if (methods_->count(name)) throw ValueError("ActorWorkers '" + type_ + "': method '" + name + "' declared twice");
    entries_.push_back(detail::actor_signature<Sig>::entry(name, std::move(options)));
    methods_->emplace(name, detail::actor_signature<Sig>::template bind<Tag>(name));
    return *this;
  }

  /// The launcher placing this type's workers (registers the type on first use); for
  /// WorkerGroupOptions{.launcher = ...}.
  std::shared_ptr<WorkerLauncher> launcher();
  /// A group of pool.world_size() ranks of this type, one actor each.
  WorkerGroup make_group(const ResourcePool& pool, WorkerGroupOptions options = {});
  /// The spec of this type's groups ({type}: the actors take no init args).
  WorkerSpec spec() const { return WorkerSpec{type_, Json::object()}; }
  const std::string& type() const { return type_; }

 private:
  caf::actor_system* system_;
  Runtime* runtime_;
  std::string type_;
  std::function<caf::actor(caf::actor_system&, const WorkerEnv&)> factory_;
  std::vector<MethodEntry> entries_;
  std::shared_ptr<detail::ActorMethods> methods_ = std::make_shared<detail::ActorMethods>();
  std::shared_ptr<WorkerLauncher> launcher_;
};

}  // namespace hyflow::actors

// Short names in hyflow:: for what embedding applications write.
namespace hyflow {
using actors::ActorWorkers;
}  // namespace hyflow
