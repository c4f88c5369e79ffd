#include <hyflow/actors/value.hpp>

namespace hyflow::actors {

struct ValueFuture::State {
  std::shared_future<Value> future;
};

ValueFuture ValueFuture::from(std::shared_future<Value> future) {
  ValueFuture out;
  out.state_ = std::make_shared<State>(State{std::move(future)});
  return out;
}

Value ValueFuture::get() const {
  if (!state_) throw ValueError("ValueFuture::get: empty future");
  return state_->future.get();
}

bool ValueFuture::is_ready() const { return wait_for(std::chrono::milliseconds(0)); }

bool ValueFuture::wait_for(std::chrono::milliseconds timeout) const {
  return state_ && state_->future.wait_for(timeout) == std::future_status::ready;
}

namespace detail {
void throw_conversion_error(const std::string& what, const Value& v, const std::string& target) {
  throw BindError(what + ": expected " + target + ", got " + v.kind());
}
}  // namespace detail

namespace {
template <class T>
T& get_or_throw(Value::Storage& s, const Value& self, const char* target) {
  if (auto* p = std::get_if<T>(&s)) return *p;
  throw BindError(std::string("Value: expected ") + target + ", holds " + self.kind());
}
}  // namespace

const DataProto& Value::dataproto() const {
  return get_or_throw<DataProto>(const_cast<Storage&>(storage_), *this, "DataProto");
}
DataProto& Value::dataproto() { return get_or_throw<DataProto>(storage_, *this, "DataProto"); }
const Json& Value::json() const { return get_or_throw<Json>(const_cast<Storage&>(storage_), *this, "Json"); }
const Value::List& Value::list() const {
  return get_or_throw<detail::ListBox>(const_cast<Storage&>(storage_), *this, "a list").items;
}
Value::List& Value::list() { return get_or_throw<detail::ListBox>(storage_, *this, "a list").items; }
const DataProtoFuture& Value::dataproto_future() const {
  return get_or_throw<DataProtoFuture>(const_cast<Storage&>(storage_), *this, "DataProtoFuture");
}
const ValueFuture& Value::value_future() const {
  return get_or_throw<ValueFuture>(const_cast<Storage&>(storage_), *this, "ValueFuture");
}

Value Value::materialized() const {
  if (is_dataproto_future()) return Value(dataproto_future().get());
  if (is_value_future()) return value_future().get().materialized();
  return *this;
}

std::string Value::kind() const {
  struct Visitor {
    std::string operator()(const std::monostate&) const { return "none"; }
    std::string operator()(const DataProto& d) const { return "DataProto(" + std::to_string(d.size()) + " rows)"; }
    std::string operator()(const Json& j) const { return std::string("Json(") + j.type_name() + ")"; }
    std::string operator()(const detail::ListBox& l) const { return "list[" + std::to_string(l.items.size()) + "]"; }
    std::string operator()(const DataProtoFuture&) const { return "DataProtoFuture"; }
    std::string operator()(const ValueFuture&) const { return "ValueFuture"; }
  };
  return std::visit(Visitor{}, storage_);
}

}  // namespace hyflow::actors
