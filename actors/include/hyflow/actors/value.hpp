#pragma once
// Value: what crosses the worker boundary as an argument or a result. On the wire (issue 4)
// only none, DataProto, Json and lists travel; futures exist in-process only and are
// materialized before anything is sent to another process.

#include <hyflow/actors/error.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/dataproto/data_proto_future.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace hyflow::actors {

class Value;

/// A result that is not there yet and is not a DataProto (non-blocking calls). Copies share
/// one state; get() waits and rethrows a failure; then() runs a continuation when it arrives.
class ValueFuture {
 public:
  ValueFuture() = default;
  /// Wraps a std::shared_future (a factory, not a constructor: Value is incomplete here). A
  /// continuation on such a future waits for it on a thread of its own; futures of a
  /// ValuePromise (what the runtime returns) need none.
  static ValueFuture from(std::shared_future<Value> future);
  bool valid() const { return state_ != nullptr; }
  Value get() const;
  bool is_ready() const;
  bool wait_for(std::chrono::milliseconds timeout) const;
  /// Continuation: exactly one of the two runs once the result arrives, on the thread that
  /// completes the call (the group's collector thread; keep it short and never make a
  /// blocking call of the same runtime from it), or at once when it has arrived. An
  /// exception escaping either is reported on stderr and dropped.
  void then(std::function<void(Value)> on_value, std::function<void(std::exception_ptr)> on_error) const;

 private:
  friend class ValuePromise;
  struct State;
  std::shared_ptr<State> state_;
};

/// The producer's side of a ValueFuture (set once; continuations run on the setting thread).
class ValuePromise {
 public:
  ValuePromise();
  ValueFuture get_future() const;
  /// False when already settled (the call has no effect then).
  bool set_value(Value value) const;
  bool set_exception(std::exception_ptr error) const;

 private:
  std::shared_ptr<ValueFuture::State> state_;
};

namespace detail {
/// Holds a std::vector<Value> inside Value's variant. Its special members are defined after
/// Value is complete (a vector of an incomplete type cannot be destroyed in a C++20 variant).
struct ListBox {
  ListBox();
  explicit ListBox(std::vector<Value> v);
  ListBox(const ListBox&);
  ListBox(ListBox&&) noexcept;
  ListBox& operator=(const ListBox&);
  ListBox& operator=(ListBox&&) noexcept;
  ~ListBox();
  std::vector<Value> items;
};
}  // namespace detail

class Value {
 public:
  using List = std::vector<Value>;
  /// none, a batch, a JSON value (scalars, strings, vectors, objects), a list of values
  /// (per-rank results), or an in-process future of either kind.
  using Storage = std::variant<std::monostate, DataProto, Json, detail::ListBox, DataProtoFuture, ValueFuture>;

  Value() = default;
  Value(DataProto v) : storage_(std::move(v)) {}
  Value(Json v) : storage_(std::move(v)) {}
  Value(List v) : storage_(detail::ListBox(std::move(v))) {}
  Value(DataProtoFuture v) : storage_(std::move(v)) {}
  Value(ValueFuture v) : storage_(std::move(v)) {}

  bool is_none() const { return std::holds_alternative<std::monostate>(storage_); }
  bool is_dataproto() const { return std::holds_alternative<DataProto>(storage_); }
  bool is_json() const { return std::holds_alternative<Json>(storage_); }
  bool is_list() const { return std::holds_alternative<detail::ListBox>(storage_); }
  bool is_dataproto_future() const { return std::holds_alternative<DataProtoFuture>(storage_); }
  bool is_value_future() const { return std::holds_alternative<ValueFuture>(storage_); }
  bool is_future() const { return is_dataproto_future() || is_value_future(); }

  /// Typed access; a wrong kind throws BindError naming both kinds.
  const DataProto& dataproto() const;
  DataProto& dataproto();
  const Json& json() const;
  const List& list() const;
  List& list();
  const DataProtoFuture& dataproto_future() const;
  const ValueFuture& value_future() const;

  /// Waits for a future (recursively) and returns the plain value; others as they are.
  Value materialized() const;

  /// "none", "DataProto", "Json(number)", "list[4]", "DataProtoFuture", "ValueFuture".
  std::string kind() const;

  const Storage& storage() const { return storage_; }
  Storage& storage() { return storage_; }

 private:
  Storage storage_;
};

namespace detail {
inline ListBox::ListBox() = default;
inline ListBox::ListBox(std::vector<Value> v) : items(std::move(v)) {}
inline ListBox::ListBox(const ListBox&) = default;
inline ListBox::ListBox(ListBox&&) noexcept = default;
inline ListBox& ListBox::operator=(const ListBox&) = default;
inline ListBox& ListBox::operator=(ListBox&&) noexcept = default;
inline ListBox::~ListBox() = default;
}  // namespace detail

/// An argument that is already split per rank (DP_COMPUTE, ALL_TO_ALL): element i goes to
/// rank i. Typed calls use it where the method takes one T but the caller has a T per rank.
template <class T>
struct PerRank {
  using value_type = T;
  std::vector<T> values;
};
template <class T>
PerRank<T> per_rank(std::vector<T> values) {
  return {std::move(values)};
}

namespace detail {
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_per_rank : std::false_type {};
template <class T>
struct is_per_rank<PerRank<T>> : std::true_type {};

[[noreturn]] void throw_conversion_error(const std::string& what, const Value& v, const std::string& target);
}  // namespace detail

/// Wraps a C++ value: DataProto/futures/Value as they are, PerRank<T> as a list, everything
/// else through nlohmann::json.
template <class T>
Value to_value(T&& x) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, Value>) {
    return std::forward<T>(x);
  } else if constexpr (std::is_same_v<D, DataProto> || std::is_same_v<D, DataProtoFuture> ||
                       std::is_same_v<D, ValueFuture> || std::is_same_v<D, Json>) {
    return Value(std::forward<T>(x));
  } else if constexpr (detail::is_per_rank<D>::value) {
    Value::List out;
    out.reserve(x.values.size());
    for (auto& v : x.values) out.push_back(to_value(v));
    return Value(std::move(out));
  } else {
    return Value(Json(std::forward<T>(x)));
  }
}

/// Unwraps into T; `what` names the argument in the error ("argument 1 of 'update_critic'").
/// DataProto accepts a DataProtoFuture (waits for it); DataProtoFuture accepts a DataProto.
template <class T>
T from_value(Value v, const std::string& what) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, Value>) {
    return v;
  } else if constexpr (std::is_same_v<D, DataProto>) {
    if (v.is_dataproto()) return std::move(v.dataproto());
    if (v.is_future()) return from_value<D>(v.materialized(), what);
    detail::throw_conversion_error(what, v, "DataProto");
  } else if constexpr (std::is_same_v<D, DataProtoFuture>) {
    if (v.is_dataproto_future()) return v.dataproto_future();
    if (v.is_dataproto()) return DataProtoFuture::ready(std::move(v.dataproto()));
    detail::throw_conversion_error(what, v, "DataProtoFuture");
  } else if constexpr (detail::is_vector<D>::value) {
    if (v.is_future()) return from_value<D>(v.materialized(), what);
    if (v.is_list()) {
      D out;
      auto& items = v.list();
      out.reserve(items.size());
      for (size_t i = 0; i < items.size(); ++i)
        out.push_back(from_value<typename D::value_type>(std::move(items[i]), what + "[" + std::to_string(i) + "]"));
      return out;
    }
    if (v.is_json()) {
      try {
        return v.json().get<D>();
      } catch (const Json::exception& e) {
        detail::throw_conversion_error(what + " (" + e.what() + ")", v, "a vector");
      }
    }
    detail::throw_conversion_error(what, v, "a vector");
  } else {
    if (v.is_future()) return from_value<D>(v.materialized(), what);
    if (!v.is_json()) detail::throw_conversion_error(what, v, "a JSON-convertible value");
    try {
      return v.json().get<D>();
    } catch (const Json::exception& e) {
      detail::throw_conversion_error(what + " (" + e.what() + ")", v, "the parameter type");
    }
  }
}

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
using actors::from_value;
using actors::per_rank;
using actors::PerRank;
using actors::to_value;
using actors::Value;
using actors::ValueFuture;
using actors::ValuePromise;
}  // namespace hyflow
