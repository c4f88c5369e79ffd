#pragma once
// The method table: verl's @register in C++. A worker class lists the member functions the
// controller may call, each with {dispatch, execute, blocking, materialize_futures}:
//
//   static void define_methods(hyflow::MethodTable<CriticWorker>& t) {
//     t.add("update_critic", &CriticWorker::update_critic, {.dispatch = hyflow::Dispatch::DP_COMPUTE_PROTO});
//   }
//
// Members keep ordinary signatures; arguments and results are converted from and to Value.

#include <hyflow/actors/value.hpp>

#include <array>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

namespace hyflow::actors {

class Worker;

/// Dispatch and execute modes are names in open registries (dispatch.hpp); these are the
/// predefined ones, spelled as in verl.
namespace Dispatch {
inline constexpr const char* RANK_ZERO = "RANK_ZERO";
inline constexpr const char* ONE_TO_ALL = "ONE_TO_ALL";
inline constexpr const char* ALL_TO_ALL = "ALL_TO_ALL";
inline constexpr const char* DP_COMPUTE = "DP_COMPUTE";
inline constexpr const char* DP_COMPUTE_PROTO = "DP_COMPUTE_PROTO";
inline constexpr const char* DP_COMPUTE_PROTO_WITH_FUNC = "DP_COMPUTE_PROTO_WITH_FUNC";
inline constexpr const char* DP_COMPUTE_METRIC = "DP_COMPUTE_METRIC";
inline constexpr const char* DIRECT_ROLLOUT_METHOD = "DIRECT_ROLLOUT_METHOD";
}  // namespace Dispatch
namespace Execute {
inline constexpr const char* ALL = "ALL";
inline constexpr const char* RANK_ZERO = "RANK_ZERO";
}  // namespace Execute

struct DispatchFns;

/// verl's @register keyword arguments, with verl's defaults.
struct MethodOptions {
  std::string dispatch = Dispatch::ALL_TO_ALL;
  std::string execute = Execute::ALL;
  bool blocking = true;
  bool materialize_futures = true;
  /// An inline {dispatch_fn, collect_fn} pair instead of a registered mode (verl accepts a
  /// raw dict as dispatch_mode). Takes precedence over `dispatch` when set.
  std::shared_ptr<const DispatchFns> inline_dispatch{};
};

/// One callable member, type-erased.
struct MethodEntry {
  std::string name;
  MethodOptions options;
  size_t arity = 0;
  /// Parameter and result type names, for error messages ("DataProto", "int", ...).
  std::vector<std::string> parameter_types;
  std::string result_type;
  bool returns_dataproto = false;
  /// Runs the member on a worker; throws BindError on a wrong argument count or type.
  std::function<Value(Worker&, std::vector<Value>&)> invoke;
  /// Identity of the member pointer, for typed calls (`wg.call(&W::f, ...)`).
  std::type_index pointer_type = typeid(void);
  std::array<unsigned char, 2 * sizeof(void*)> pointer_bytes{};
};

/// The methods of one worker class (or of a colocated bundle), by name.
class MethodTableBase {
 public:
  const MethodEntry* find(const std::string& name) const;
  /// find() or BindError listing the known names.
  const MethodEntry& at(const std::string& name, const std::string& worker_type) const;
  const std::map<std::string, MethodEntry>& entries() const { return entries_; }
  /// Adds an entry; BindError when the name is taken.
  void insert(MethodEntry entry);

 private:
  std::map<std::string, MethodEntry> entries_;
};

namespace detail {
template <class T>
std::string type_label() {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, void>) return "void";
  else if constexpr (std::is_same_v<D, DataProto>) return "DataProto";
  else if constexpr (std::is_same_v<D, DataProtoFuture>) return "DataProtoFuture";
  else if constexpr (std::is_same_v<D, Json>) return "Json";
  else if constexpr (std::is_same_v<D, Value>) return "Value";
  else if constexpr (std::is_same_v<D, std::string>) return "string";
  else if constexpr (std::is_same_v<D, bool>) return "bool";
  else if constexpr (std::is_integral_v<D>) return "integer";
  else if constexpr (std::is_floating_point_v<D>) return "float";
  else if constexpr (is_vector<D>::value) return "vector<" + type_label<typename D::value_type>() + ">";
  else return typeid(D).name();
}

template <class Fn>
void store_pointer(MethodEntry& e, Fn fn) {
  static_assert(sizeof(Fn) <= sizeof(e.pointer_bytes));
  e.pointer_type = typeid(Fn);
  std::memcpy(e.pointer_bytes.data(), &fn, sizeof(Fn));
}

template <class Fn>
bool same_pointer(const MethodEntry& e, Fn fn) {
  if (e.pointer_type != std::type_index(typeid(Fn))) return false;
  return std::memcmp(e.pointer_bytes.data(), &fn, sizeof(Fn)) == 0;
}

void check_arity(const std::string& method, size_t expected, size_t got);

template <class W, class R, class... Args, class Fn, size_t... I>
Value invoke_member(W& self, Fn fn, const std::string& name, std::vector<Value>& args, std::index_sequence<I...>) {
  check_arity(name, sizeof...(Args), args.size());
  if constexpr (std::is_void_v<R>) {
    (self.*fn)(from_value<std::decay_t<Args>>(
        std::move(args[I]), "argument " + std::to_string(I) + " of '" + name + "'")...);
    return Value();
  } else {
    return to_value((self.*fn)(from_value<std::decay_t<Args>>(
        std::move(args[I]), "argument " + std::to_string(I) + " of '" + name + "'")...));
  }
}
}  // namespace detail

/// The table of worker class W. Built once per class from W::define_methods plus the
/// built-ins of Worker (query_dispatch_info, query_collect_info, ...).
template <class W>
class MethodTable : public MethodTableBase {
 public:
  template <class R, class C, class... Args>
  MethodTable& add(std::string name, R (C::*fn)(Args...), MethodOptions options = {}) {
    return add_impl<R, C, Args...>(std::move(name), fn, std::move(options));
  }
  template <class R, class C, class... Args>
  MethodTable& add(std::string name, R (C::*fn)(Args...) const, MethodOptions options = {}) {
    return add_impl<R, C, Args...>(std::move(name), fn, std::move(options));
  }

  /// Name of a registered member (typed calls); BindError if it was never added.
  template <class Fn>
  const MethodEntry& entry_of(Fn fn) const {
    for (const auto& [name, e] : entries())
      if (detail::same_pointer(e, fn)) return e;
    throw BindError("member function is not in the method table of this worker class (add it in define_methods)");
  }

  /// The table of W, built on first use.
  static const MethodTable& get();

 private:
  template <class R, class C, class... Args, class Fn>
  MethodTable& add_impl(std::string name, Fn fn, MethodOptions options) {
    static_assert(std::is_base_of_v<C, W>, "method must be a member of the worker class or its bases");
    MethodEntry e;
    e.name = name;
    e.options = std::move(options);
    e.arity = sizeof...(Args);
    e.parameter_types = {detail::type_label<Args>()...};
    e.result_type = detail::type_label<R>();
    e.returns_dataproto = std::is_same_v<std::decay_t<R>, DataProto>;
    e.invoke = [fn, name](Worker& w, std::vector<Value>& args) -> Value {
      return detail::invoke_member<C, R, Args...>(static_cast<C&>(static_cast<W&>(w)), fn, name, args,
                                                  std::index_sequence_for<Args...>{});
    };
    detail::store_pointer(e, fn);
    insert(std::move(e));
    return *this;
  }
};

/// Adds the methods every worker has (query_dispatch_info, query_collect_info,
/// execute_with_func_generator, execute_func_rank_zero); defined in worker.hpp.
template <class W>
void add_builtin_methods(MethodTable<W>& table);

template <class W>
const MethodTable<W>& MethodTable<W>::get() {
  static const MethodTable<W> table = [] {
    MethodTable<W> t;
    add_builtin_methods<W>(t);
    W::define_methods(t);
    return t;
  }();
  return table;
}

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
namespace Dispatch = actors::Dispatch;
namespace Execute = actors::Execute;
using actors::MethodOptions;
using actors::MethodTable;
}  // namespace hyflow
