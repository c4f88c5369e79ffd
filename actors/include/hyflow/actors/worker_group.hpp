#pragma once
// WorkerGroup: the controller's handle to N workers of one class. A call runs
//   dispatch -> execute (one CAF request per rank) -> await or future -> collect -> un-pad
// with the modes from the method table:
//
//   hyflow::WorkerGroup critic(runtime, hyflow::ResourcePool({4}), {"CriticWorker", config});
//   hyflow::DataProto values = critic.call(&CriticWorker::compute_values, batch);  // typed
//   hyflow::Value metrics = critic.call("update_critic", batch);                    // by name

#include <hyflow/actors/detail/pending_call.hpp>
#include <hyflow/actors/dispatch.hpp>
#include <hyflow/actors/resource_pool.hpp>
#include <hyflow/actors/runtime.hpp>
#include <hyflow/actors/value.hpp>
#include <hyflow/actors/worker_registry.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace hyflow::actors {

struct WorkerGroupOptions {
  /// Prefix of worker names ("{prefix}{type}_{node}:{local_rank}").
  std::string name_prefix{};
  /// Workers outlive the group and can be re-attached with WorkerGroup::from_detached.
  bool detached = false;
  /// Watchdog: default deadline of every call, 10 minutes as verl's collective timeout, so that
  /// a worker that never answers (its node stopped and no heartbeat noticed) still ends the
  /// call with an error naming it. std::nullopt: wait forever.
  std::optional<std::chrono::milliseconds> call_deadline = std::chrono::minutes(10);
  /// With a handler the watchdog only reports (the call keeps waiting); without one the call
  /// fails with CallTimeoutError naming the method and the ranks that have not answered.
  /// Either way a line goes to stderr.
  std::function<void(const DeadlineReport&)> on_deadline{};
  /// Where this group's workers are placed; unset: the Runtime's launcher (in-process by
  /// default). Groups of one Runtime can use different launchers (a remote pool for the
  /// policy, in-process workers for a rule reward, your own actors).
  std::shared_ptr<WorkerLauncher> launcher{};
};

/// Per-call settings (override the group's and the method's defaults).
struct CallOptions {
  std::optional<std::chrono::milliseconds> deadline{};
  /// Wait for the result (true) or return a future at once (false); unset: the method's
  /// `blocking` flag from its table (verl's default).
  std::optional<bool> blocking{};
};

/// Where the time of the last call went, in microseconds.
struct CallTiming {
  std::string method;
  double dispatch_us = 0;  ///< argument splitting (and padding)
  double execute_us = 0;   ///< first send to last answer
  double collect_us = 0;   ///< collect and un-pad
  double total_us = 0;
  std::vector<double> rank_us;  ///< start to each executed rank's answer
};

/// A typed call's result. Converts to R (RANK_ZERO-style single results and DataProto
/// concatenations), std::vector<R> (per-rank lists), DataProtoFuture / ValueFuture
/// (non-blocking methods), or Value. A conversion that does not match what the dispatch mode
/// produced throws BindError naming the method.
template <class R>
class TypedResult {
  template <class T>
  static constexpr bool allowed() {
    if constexpr (std::is_same_v<T, Value> || std::is_same_v<T, ValueFuture>) return true;
    else if constexpr (std::is_void_v<R>) return false;
    else return std::is_same_v<T, R> || std::is_same_v<T, std::vector<R>> ||
                (std::is_same_v<R, DataProto> && std::is_same_v<T, DataProtoFuture>);
  }

 public:
  TypedResult(Value value, std::string method) : value_(std::move(value)), method_(std::move(method)) {}
  const Value& value() const& { return value_; }
  Value value() && { return std::move(value_); }

  template <class T, std::enable_if_t<allowed<T>(), int> = 0>
  operator T() const {
    if constexpr (std::is_same_v<T, Value>) {
      return value_;
    } else if constexpr (std::is_same_v<T, ValueFuture>) {
      if (!value_.is_value_future()) throw BindError(mismatch("a ValueFuture"));
      return value_.value_future();
    } else if constexpr (std::is_same_v<T, DataProtoFuture>) {
      if (!value_.is_dataproto_future()) throw BindError(mismatch("a DataProtoFuture"));
      return value_.dataproto_future();
    } else if constexpr (detail::is_vector<T>::value && !std::is_same_v<T, R>) {
      Value v = value_.is_future() ? value_.materialized() : value_;
      if (!v.is_list()) throw BindError(mismatch("a per-rank list"));
      return from_value<T>(std::move(v), "result of '" + method_ + "'");
    } else {
      Value v = value_.is_future() ? value_.materialized() : value_;
      if (v.is_list()) throw BindError(mismatch("one value (convert to std::vector<R> for per-rank results)"));
      return from_value<T>(std::move(v), "result of '" + method_ + "'");
    }
  }

 private:
  std::string mismatch(const std::string& wanted) const {
    return "result of '" + method_ + "' is " + value_.kind() + ", asked for " + wanted;
  }
  Value value_;
  std::string method_;
};

namespace detail {
struct GroupView;
/// The asynchronous call of a CAF actor (WorkerGroup::request); defined in
/// <hyflow/actors/group_actor.hpp>, which the caller includes.
template <class Self>
struct GroupRequest;

template <class P, class A>
constexpr bool argument_fits() {
  using DP = std::decay_t<P>;
  using DA = std::decay_t<A>;
  if constexpr (std::is_same_v<DA, Value>) return true;  // checked at run time
  else if constexpr (is_per_rank<DA>::value) return std::is_convertible_v<typename DA::value_type, DP>;
  else if constexpr (std::is_same_v<DP, DataProto>)
    return std::is_same_v<DA, DataProto> || std::is_same_v<DA, DataProtoFuture>;
  else return std::is_convertible_v<DA, DP>;
}
}  // namespace detail

class WorkerGroup {
 public:
  /// Launches world_size workers of `spec` on `pool` through the runtime's launcher and
  /// initializes them (constructor errors surface here, naming the rank).
  WorkerGroup(Runtime& runtime, const ResourcePool& pool, WorkerSpec spec, WorkerGroupOptions options = {});
  /// Re-attaches to detached workers by name (verl's from_detached); ranks in the given order.
  static WorkerGroup from_detached(Runtime& runtime, const std::vector<std::string>& worker_names,
                                   WorkerGroupOptions options = {});
  /// Copies share the workers (and the last-call timing).
  WorkerGroup(const WorkerGroup&) = default;
  WorkerGroup& operator=(const WorkerGroup&) = default;
  WorkerGroup(WorkerGroup&&) noexcept = default;
  WorkerGroup& operator=(WorkerGroup&&) noexcept = default;
  ~WorkerGroup();

  int world_size() const;
  /// Registered type name of the workers (of the role, for a spawned view).
  const std::string& worker_type() const;
  std::vector<std::string> worker_names() const;
  const std::string& master_address() const;
  int master_port() const;
  /// The methods callable through this group (prefixes stripped for a spawned view).
  const MethodTableBase& methods() const;

  /// By-name call: arguments are checked against the method table (count) before dispatch
  /// and by the worker (types); errors name the method and the mismatch.
  template <class... A>
  Value call(const std::string& method, A&&... args) {
    return call_values(method, {to_value(std::forward<A>(args))...}, {});
  }
  template <class... A>
  Value call(const CallOptions& options, const std::string& method, A&&... args) {
    return call_values(method, {to_value(std::forward<A>(args))...}, options);
  }
  Value call_values(const std::string& method, std::vector<Value> args, const CallOptions& options = {});

  /// Typed call: the member must be in this group's method table; argument types are checked
  /// by the compiler (PerRank<T> for per-rank arguments, Value to defer the check).
  template <class W, class R, class... P, class... A>
  TypedResult<R> call(R (W::*fn)(P...), A&&... args) {
    return typed_call<W, R, std::tuple<P...>>(fn, CallOptions{}, std::forward<A>(args)...);
  }
  template <class W, class R, class... P, class... A>
  TypedResult<R> call(R (W::*fn)(P...) const, A&&... args) {
    return typed_call<W, R, std::tuple<P...>>(fn, CallOptions{}, std::forward<A>(args)...);
  }
  template <class W, class R, class... P, class... A>
  TypedResult<R> call(const CallOptions& options, R (W::*fn)(P...), A&&... args) {
    return typed_call<W, R, std::tuple<P...>>(fn, options, std::forward<A>(args)...);
  }

  /// Starts a call and returns at once: exactly one of `on_value` (the collected, un-padded
  /// result) and `on_error` (the exception a blocking call would throw) runs when the call
  /// completes, on the thread that completes it (the group's collector thread; keep them short
  /// and never make a blocking call of the same runtime there). Dispatch errors (unknown
  /// method, wrong argument count) are thrown here.
  void call_then(const std::string& method, std::vector<Value> args, std::function<void(Value)> on_value,
                 std::function<void(std::exception_ptr)> on_error, const CallOptions& options = {}) const;

  /// Asynchronous call from a CAF actor (include <hyflow/actors/group_actor.hpp>). Prefer the
  /// free function in CAF's argument order, with a timeout:
  ///   hyflow::request(self, critic, 30s, &Critic::compute_values, batch).then(
  ///       [=](DataProto values) { ... }, [=](caf::error& e) { ... });
  /// These members are the same call without a timeout (caf::infinite), kept for existing code.
  /// The handlers run in `self`'s context when the call completes; `self` keeps handling other
  /// messages meanwhile. Errors arrive as caf::error of the "hyflow" category (see
  /// group_actor.hpp); the result converts like TypedResult<R>.
  template <class Self, class W, class R, class... P, class... A>
  auto request(Self* self, R (W::*fn)(P...), A&&... args) const {
    return typed_request<Self, W, R, std::tuple<P...>>(self, std::nullopt, fn, std::forward<A>(args)...);
  }
  template <class Self, class W, class R, class... P, class... A>
  auto request(Self* self, R (W::*fn)(P...) const, A&&... args) const {
    return typed_request<Self, W, R, std::tuple<P...>>(self, std::nullopt, fn, std::forward<A>(args)...);
  }
  /// By name; the result handler gets a Value (or anything TypedResult<Value> converts to).
  template <class Self, class... A>
  auto request(Self* self, const std::string& method, A&&... args) const {
    return detail::GroupRequest<Self>::template make<Value>(self, *this, method,
                                                            std::vector<Value>{to_value(std::forward<A>(args))...},
                                                            std::nullopt);
  }

  /// Timing of the last call made through this handle.
  CallTiming last_timing() const;

  /// Colocated groups: one view per role sharing these workers, method names without the
  /// "{role}_" prefix (verl's spawn). With fused, calls go through the bundle's single
  /// "fused_execute" entry point carrying role and method (verl's fused worker).
  std::map<std::string, WorkerGroup> spawn(const std::vector<std::string>& roles, bool fused = false) const;

  /// Terminates the worker of `rank` (pending and later calls fail naming it).
  void kill_worker(int rank);
  bool alive(int rank) const;

 private:
  explicit WorkerGroup(std::shared_ptr<detail::GroupView> view);
  template <class W, class R, class Params, class Fn, class... A>
  TypedResult<R> typed_call(Fn fn, const CallOptions& options, A&&... args) {
    static_assert(std::is_base_of_v<Worker, W>, "typed calls take members of hyflow::Worker classes");
    static_assert(std::tuple_size_v<Params> == sizeof...(A), "wrong number of arguments for this method");
    static_assert(check_arguments<Params, A...>(std::index_sequence_for<A...>{}),
                  "an argument does not convert to the method's parameter type");
    const std::string name = name_of(fn);
    return TypedResult<R>(call_values(name, {to_value(std::forward<A>(args))...}, options), name);
  }
  template <class Self>
  friend struct detail::GroupRequest;
  template <class Self, class W, class R, class Params, class Fn, class... A>
  auto typed_request(Self* self, std::optional<std::chrono::milliseconds> timeout, Fn fn, A&&... args) const {
    static_assert(std::is_base_of_v<Worker, W>, "typed calls take members of hyflow::Worker classes");
    static_assert(std::tuple_size_v<Params> == sizeof...(A), "wrong number of arguments for this method");
    static_assert(check_arguments<Params, A...>(std::index_sequence_for<A...>{}),
                  "an argument does not convert to the method's parameter type");
    return detail::GroupRequest<Self>::template make<R>(
        self, *this, name_of(fn), std::vector<Value>{to_value(std::forward<A>(args))...}, timeout);
  }
  template <class Params, class... A, size_t... I>
  static constexpr bool check_arguments(std::index_sequence<I...>) {
    return (detail::argument_fits<std::tuple_element_t<I, Params>, A>() && ...);
  }
  /// The method name of a member; BindError when it is not in the table or is registered
  /// under several names (then only a by-name call says which).
  template <class Fn>
  std::string name_of(Fn fn) const {
    std::vector<std::string> found;
    for (const auto& [name, e] : methods().entries())
      if (detail::same_pointer(e, fn)) found.push_back(e.name);
    if (found.size() == 1) return found.front();
    if (found.empty())
      throw BindError("member function is not a method of worker type '" + worker_type() +
                      "' (add it to define_methods, or call through the right group)");
    std::string names;
    for (const auto& n : found) names += (names.empty() ? "'" : ", '") + n + "'";
    throw BindError("member function is registered under several names (" + names + ") of worker type '" +
                    worker_type() + "'; call it by name");
  }

  std::shared_ptr<detail::GroupView> view_;
};

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
using actors::CallOptions;
using actors::WorkerGroup;
using actors::WorkerGroupOptions;
}  // namespace hyflow
