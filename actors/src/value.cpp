#include <hyflow/actors/value.hpp>

#include <mutex>
#include <system_error>
#include <thread>

namespace hyflow::actors {

struct ValueFuture::State {
  dataproto::detail::SharedResult<Value> result;
  std::shared_future<Value> legacy;  ///< from(): copied into `result` once it is ready
  std::once_flag watching;

  void take_legacy() {
    try {
      result.set_value(legacy.get());
    } catch (...) {
      result.set_exception(std::current_exception());
    }
  }
};

ValueFuture ValueFuture::from(std::shared_future<Value> future) {
  if (!future.valid()) throw ValueError("ValueFuture::from: not a valid future");
  ValueFuture out;
  out.state_ = std::make_shared<State>();
  out.state_->legacy = std::move(future);
  return out;
}

Value ValueFuture::get() const {
  if (!state_) throw ValueError("ValueFuture::get: empty future");
  if (state_->legacy.valid()) return state_->legacy.get();
  return state_->result.get();
}

bool ValueFuture::is_ready() const {
  return wait_for(std::chrono::milliseconds(0));
}

bool ValueFuture::wait_for(std::chrono::milliseconds timeout) const {
  if (!state_) return false;
  if (state_->legacy.valid()) return state_->legacy.wait_for(timeout) == std::future_status::ready;
  return state_->result.wait_until(std::chrono::steady_clock::now() + timeout);
}

void ValueFuture::then(std::function<void(Value)> on_value, std::function<void(std::exception_ptr)> on_error) const {
  if (!state_) throw ValueError("ValueFuture::then: empty future");
  if (!on_value || !on_error) throw ValueError("ValueFuture::then: empty continuation");
  auto state = state_;
  if (state->legacy.valid()) {
    std::call_once(state->watching, [state] {
      if (state->legacy.wait_for(std::chrono::seconds(0)) == std::future_status::ready) return state->take_legacy();
      try {  // std::shared_future cannot notify: wait on a thread of our own
        std::thread([state] { state->take_legacy(); }).detach();
      } catch (const std::system_error&) {
        state->take_legacy();
      }
    });
  }
  state->result.subscribe([state, on_value = std::move(on_value), on_error = std::move(on_error)] {
    state->result.deliver(on_value, on_error);
  });
}

ValuePromise::ValuePromise() : state_(std::make_shared<ValueFuture::State>()) {}

ValueFuture ValuePromise::get_future() const {
  ValueFuture out;
  out.state_ = state_;
  return out;
}

bool ValuePromise::set_value(Value value) const {
  return state_->result.set_value(std::move(value));
}
bool ValuePromise::set_exception(std::exception_ptr error) const {
  return state_->result.set_exception(std::move(error));
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
DataProto& Value::dataproto() {
  return get_or_throw<DataProto>(storage_, *this, "DataProto");
}
const Json& Value::json() const {
  return get_or_throw<Json>(const_cast<Storage&>(storage_), *this, "Json");
}
const Value::List& Value::list() const {
  return get_or_throw<detail::ListBox>(const_cast<Storage&>(storage_), *this, "a list").items;
}
Value::List& Value::list() {
  return get_or_throw<detail::ListBox>(storage_, *this, "a list").items;
}
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
