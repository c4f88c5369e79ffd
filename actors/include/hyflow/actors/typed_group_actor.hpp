#pragma once
// A worker group (or one spawned role of a colocated group) as a typed CAF actor whose message
// interface follows the worker's method table (only CAF translation units include this header):
//
//   using Generate = hyflow::method<"generate", &ToyPolicy::generate>;   // DataProto(DataProto)
//   using Update = hyflow::method<"update", &ToyPolicy::update>;         // per rank: vector<Json>
//   using policy_actor = hyflow::typed_group_actor<Generate, Update>;
//   // = caf::typed_actor<caf::replies_to<Generate, DataProto>::with<DataProto>,
//   //                    caf::replies_to<Update, DataProto>::with<std::vector<Json>>>
//   policy_actor policy = hyflow::spawn_typed_group_actor<Generate, Update>(system, policy_group);
//   self->request(policy, caf::infinite, Generate{}, prompts).then([=](DataProto responses) { ... });
//
// The compiler checks every request (message and result types) as for any typed actor; the
// spawn checks the interface against the group's method table and refuses, with a BindError
// naming the method, a method the table lacks, one registered with another signature or for
// another member, and a declared result that the method's dispatch mode cannot produce.
// Failed calls arrive as caf::error of the "hyflow" category (group_actor.hpp: error_kind).

#include <hyflow/actors/caf_inspect.hpp>
#include <hyflow/actors/group_actor.hpp>
#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker_group.hpp>

#include <caf/all.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

// Json (a common result: metrics, per-rank records) as a CAF message type: its text, with the
// nesting limit of Values received from the network. Found by argument-dependent lookup.
NLOHMANN_JSON_NAMESPACE_BEGIN
inline caf::error inspect(caf::serializer& f, basic_json<>& x) {
  std::string text = x.dump();
  return f(text);
}
inline caf::error inspect(caf::deserializer& f, basic_json<>& x) {
  using hyflow::actors::detail::json_depth;
  using hyflow::actors::detail::kMaxJsonDepth;
  std::string text;
  if (auto err = f(text)) return err;
  if (json_depth(text, kMaxJsonDepth) > kMaxJsonDepth)
    return caf::make_error(caf::sec::invalid_argument, "Json of " + std::to_string(text.size()) +
                                                           " bytes nests deeper than " + std::to_string(kMaxJsonDepth) +
                                                           " levels");
  try {
    x = basic_json<>::parse(text);
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::invalid_argument, std::string("bad Json: ") + e.what());
  }
  return {};
}
template <class Inspector>
std::enable_if_t<!std::is_base_of_v<caf::serializer, Inspector> && !std::is_base_of_v<caf::deserializer, Inspector>,
                 typename Inspector::result_type>
inspect(Inspector& f, basic_json<>& x) {
  std::string text = x.dump();
  return f(caf::meta::type_name("Json"), text);
}
NLOHMANN_JSON_NAMESPACE_END

namespace hyflow::actors {

/// A string usable as a template argument: hyflow::method<"generate", ...>.
template <size_t N>
struct fixed_string {
  char chars[N]{};
  constexpr fixed_string(const char (&s)[N]) { std::copy_n(s, N, chars); }
  constexpr std::string_view view() const { return {chars, N - 1}; }
};

namespace detail {

/// What the group call of a method answers, as declared by an interface.
enum class ResultShape : uint8_t {
  any,       ///< Value: whatever the dispatch mode collects
  one,       ///< one R (a concatenated DataProto, RANK_ZERO, execute RANK_ZERO)
  per_rank,  ///< std::vector<R>, one element per executed rank (ONE_TO_ALL, ALL_TO_ALL, ...)
  none,      ///< void methods: the reply is empty
};

/// One method of an interface, as the spawn-time check sees it.
struct InterfaceMethod {
  std::string name;
  /// Set for member descriptors: the table's entry must be this very member.
  std::optional<std::type_index> pointer_type;
  std::array<unsigned char, 2 * sizeof(void*)> pointer_bytes{};
  /// Labels as the method table writes them (type_label), for signature descriptors and errors.
  std::vector<std::string> parameter_types;
  std::string result_type;
  ResultShape shape = ResultShape::any;
  std::string declared_result;  ///< label of the interface's result type, for errors
};

/// Checks an interface against a group's method table; BindError naming the first method that
/// does not fit (missing, other signature or member, a result its modes cannot produce).
void check_interface(const WorkerGroup& group, const std::vector<InterfaceMethod>& methods);

/// The group result an interface declares by default for a method returning R: DataProto for
/// DataProto (DP_COMPUTE_PROTO concatenates), void for void, otherwise one R per rank.
template <class R>
using default_group_result = std::conditional_t<std::is_void_v<R> || std::is_same_v<std::decay_t<R>, DataProto>,
                                                std::decay_t<R>, std::vector<std::decay_t<R>>>;

template <class R, class Result>
constexpr ResultShape shape_of() {
  if constexpr (std::is_void_v<R>) {
    static_assert(std::is_void_v<Result> || std::is_same_v<Result, Value>,
                  "a void method's group result is void (or Value)");
    return std::is_void_v<Result> ? ResultShape::none : ResultShape::any;
  } else if constexpr (std::is_same_v<Result, Value>) {
    return ResultShape::any;
  } else if constexpr (std::is_same_v<Result, std::decay_t<R>>) {
    return ResultShape::one;
  } else {
    static_assert(std::is_same_v<Result, std::vector<std::decay_t<R>>>,
                  "a method's group result is R (one result), std::vector<R> (one per rank) or Value");
    return ResultShape::per_rank;
  }
}

template <class R, class Result, class... P>
InterfaceMethod describe(std::string name) {
  InterfaceMethod m;
  m.name = std::move(name);
  m.parameter_types = {type_label<P>()...};
  m.result_type = type_label<R>();
  m.shape = shape_of<R, Result>();
  if constexpr (std::is_void_v<Result>)
    m.declared_result = "void";
  else
    m.declared_result = type_label<Result>();
  return m;
}

template <class Fn>
struct member_traits;
template <class C, class R, class... P>
struct member_traits<R (C::*)(P...)> {
  using result = R;
  using params = std::tuple<std::decay_t<P>...>;
};
template <class C, class R, class... P>
struct member_traits<R (C::*)(P...) const> : member_traits<R (C::*)(P...)> {};

template <class Sig>
struct signature_traits;
template <class R, class... P>
struct signature_traits<R(P...)> {
  using result = R;
  using params = std::tuple<std::decay_t<P>...>;
};

template <class Tag, class Params, class Result>
struct caf_signature;
template <class Tag, class... P, class Result>
struct caf_signature<Tag, std::tuple<P...>, Result> {
  using type = typename caf::replies_to<Tag, P...>::template with<Result>;
};

/// The parts every method descriptor shares; Self is the descriptor (the message tag).
template <class Self, fixed_string Name, class R, class Params, class Result>
struct method_base {
  using result_type = R;        ///< what the member returns on one rank
  using params = Params;        ///< the message's arguments after the tag
  using group_result = Result;  ///< what the group call answers
  using signature = typename caf_signature<Self, Params, Result>::type;
  static std::string name() { return std::string(Name.view()); }

  /// Printing for CAF (deep_to_string); tags carry no data.
  template <class Inspector>
  friend typename Inspector::result_type inspect(Inspector& f, Self&) {
    return f(caf::meta::type_name("hyflow::method"));
  }
};

template <class R, class Result, class Params>
struct describe_params;
template <class R, class Result, class... P>
struct describe_params<R, Result, std::tuple<P...>> {
  static InterfaceMethod get(std::string name) { return describe<R, Result, P...>(std::move(name)); }
};

}  // namespace detail

/// A method of a worker class by name and member: hyflow::method<"generate", &Policy::generate>.
/// The message is (method{}, parameters...); the reply is Result, by default DataProto for a
/// DataProto method, nothing for a void one, else std::vector<R> (one result per rank, as
/// ONE_TO_ALL and ALL_TO_ALL collect). Give R as Result for RANK_ZERO modes, Value for any.
/// At spawn the group's entry of that name must be this member.
template <fixed_string Name, auto Fn,
          class Result = detail::default_group_result<typename detail::member_traits<decltype(Fn)>::result>>
struct method
    : detail::method_base<method<Name, Fn, Result>, Name, typename detail::member_traits<decltype(Fn)>::result,
                          typename detail::member_traits<decltype(Fn)>::params, Result> {
  static detail::InterfaceMethod describe() {
    using T = detail::member_traits<decltype(Fn)>;
    auto m = detail::describe_params<typename T::result, Result, typename T::params>::get(std::string(Name.view()));
    m.pointer_type = std::type_index(typeid(decltype(Fn)));
    static_assert(sizeof(Fn) <= sizeof(m.pointer_bytes));
    const auto fn = Fn;
    std::memcpy(m.pointer_bytes.data(), &fn, sizeof(fn));
    return m;
  }
};

/// A method by name and signature, for tables without members (own actors as workers,
/// actor_workers.hpp, or methods of a class the caller does not see):
/// hyflow::named_method<"score", DataProto(DataProto)>. At spawn the registered parameter and
/// result types must match the signature.
template <fixed_string Name, class Sig,
          class Result = detail::default_group_result<typename detail::signature_traits<Sig>::result>>
struct named_method
    : detail::method_base<named_method<Name, Sig, Result>, Name, typename detail::signature_traits<Sig>::result,
                          typename detail::signature_traits<Sig>::params, Result> {
  static detail::InterfaceMethod describe() {
    using T = detail::signature_traits<Sig>;
    return detail::describe_params<typename T::result, Result, typename T::params>::get(std::string(Name.view()));
  }
};

/// The typed CAF handle of a group seen through methods Ms...: one replies_to<M, P...>::with<Result>
/// per method. A handle with more methods converts to one with fewer, as for any typed actor.
template <class... Ms>
using typed_group_actor = caf::typed_actor<typename Ms::signature...>;

namespace detail {

using typed_done_atom = caf::atom_constant<caf::atom("hf_tdone")>;

struct typed_group_state {
  std::optional<WorkerGroup> group;
  uint64_t next_id = 0;
  /// Calls in flight: the promise and how to deliver the group's Value as the declared result.
  struct Pending {
    caf::response_promise promise;
    std::function<void(caf::response_promise&, Value)> deliver;
  };
  std::map<uint64_t, Pending> pending;
  static inline const char* name = "hyflow.typed_group";
};
using typed_group_self = caf::stateful_actor<typed_group_state>;

/// Starts one group call for a request and returns its promise; the answer comes back to the
/// actor as a message (a promise is delivered on the actor's own thread only).
caf::response_promise start_typed_call(typed_group_self* self, const std::string& method, std::vector<Value> args,
                                       std::function<void(caf::response_promise&, Value)> deliver);

/// Delivers a group's Value as the method's declared result; a conversion that fails becomes
/// the error reply (BindError naming the method).
template <class M>
void deliver_as(caf::response_promise& promise, Value value) {
  using R = typename M::result_type;
  using Result = typename M::group_result;
  if constexpr (std::is_void_v<Result>) {
    promise.deliver(caf::unit);
  } else {
    std::optional<Result> out;
    try {
      out.emplace(TypedResult<R>(std::move(value), M::name()).operator Result());
    } catch (...) {
      promise.deliver(to_caf_error(std::current_exception()));
      return;
    }
    promise.deliver(std::move(*out));
  }
}

template <class M, class Params = typename M::params>
struct typed_handler;
template <class M, class... P>
struct typed_handler<M, std::tuple<P...>> {
  static auto make(typed_group_self* self) {
    return [self](M, P&... args) -> caf::response_promise {
      return start_typed_call(self, M::name(), std::vector<Value>{to_value(std::move(args))...}, &deliver_as<M>);
    };
  }
};

/// Delivers a finished call's value or error to its promise.
void finish_typed_call(typed_group_self* self, uint64_t id, Value* value, caf::error* error);

template <class... Ms>
caf::behavior typed_group_behavior(typed_group_self* self, WorkerGroup group) {
  self->state.group.emplace(std::move(group));
  return {
      typed_handler<Ms>::make(self)...,
      [self](typed_done_atom, uint64_t id, Value& v) { finish_typed_call(self, id, &v, nullptr); },
      [self](typed_done_atom, uint64_t id, caf::error& e) { finish_typed_call(self, id, nullptr, &e); },
  };
}

}  // namespace detail

/// Spawns a typed group actor on `system` for the methods Ms... of `group` (a whole group or
/// a spawned role of a colocated one). Throws BindError naming the method when the group's
/// table lacks one of them, has it with another signature or for another member, or its
/// dispatch mode produces another result shape than declared. Like spawn_group_actor, the
/// actor holds a copy of `group` until its last handle is gone, runs calls concurrently, and
/// after the group's Runtime has stopped its calls fail with errc::runtime_stopped.
template <class... Ms>
typed_group_actor<Ms...> spawn_typed_group_actor(caf::actor_system& system, WorkerGroup group) {
  static_assert(sizeof...(Ms) > 0, "name at least one method");
  detail::check_interface(group, {Ms::describe()...});
  return caf::actor_cast<typed_group_actor<Ms...>>(system.spawn(detail::typed_group_behavior<Ms...>, std::move(group)));
}

}  // namespace hyflow::actors

// Short names in hyflow:: for what embedding applications write.
namespace hyflow {
using actors::method;
using actors::named_method;
using actors::spawn_typed_group_actor;
using actors::typed_group_actor;
}  // namespace hyflow
