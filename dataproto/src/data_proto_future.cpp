#include <hyflow/dataproto/data_proto_future.hpp>

#include <mutex>

namespace hyflow::dataproto {

/// Either a set of parts (a root future) or a parent whose result this one transforms (a
/// chunk or a then()). The result is computed once and cached.
struct DataProtoFuture::State {
  std::vector<Part> parts;
  std::shared_ptr<State> parent;
  Transform transform;
  std::once_flag once;
  std::promise<DataProto> promise;
  std::shared_future<DataProto> result = promise.get_future().share();

  bool wait_until(std::chrono::steady_clock::time_point deadline) const {
    if (parent) return parent->wait_until(deadline);
    for (const auto& p : parts)
      if (p.wait_until(deadline) != std::future_status::ready) return false;
    return true;
  }

  const DataProto& resolve() {
    std::call_once(once, [this] {
      try {
        DataProto joined;
        if (parent) {
          joined = parent->resolve();
        } else {
          std::vector<DataProto> values;
          values.reserve(parts.size());
          for (auto& p : parts) values.push_back(p.get());
          joined = values.size() == 1 ? std::move(values[0]) : DataProto::concat(values);
        }
        promise.set_value(transform ? transform(std::move(joined)) : std::move(joined));
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    });
    return result.get();
  }
};

DataProtoFuture::DataProtoFuture(std::vector<Part> parts, Transform transform)
    : state_(std::make_shared<State>()) {
  if (parts.empty()) throw ValueError("DataProtoFuture: no parts");
  for (size_t i = 0; i < parts.size(); ++i)
    if (!parts[i].valid()) throw ValueError("DataProtoFuture: part " + std::to_string(i) + " is not a valid future");
  state_->parts = std::move(parts);
  state_->transform = std::move(transform);
}

DataProtoFuture DataProtoFuture::ready(DataProto value) {
  std::promise<DataProto> p;
  p.set_value(std::move(value));
  return DataProtoFuture({p.get_future().share()});
}

bool DataProtoFuture::is_ready() const { return wait_for(std::chrono::milliseconds(0)); }

bool DataProtoFuture::wait_for(std::chrono::milliseconds timeout) const {
  return state_ && state_->wait_until(std::chrono::steady_clock::now() + timeout);
}

DataProto DataProtoFuture::get() const {
  if (!state_) throw ValueError("DataProtoFuture::get: empty future");
  return state_->resolve();
}

std::vector<DataProtoFuture> DataProtoFuture::chunk(int64_t chunks) const {
  if (!state_) throw ValueError("DataProtoFuture::chunk: empty future");
  if (chunks <= 0) throw ValueError("DataProtoFuture::chunk: chunks must be positive, got " + std::to_string(chunks));
  std::vector<DataProtoFuture> out;
  out.reserve(static_cast<size_t>(chunks));
  for (int64_t i = 0; i < chunks; ++i)
    out.push_back(then([i, chunks](DataProto d) {
      auto pieces = d.chunk(chunks);
      if (i >= static_cast<int64_t>(pieces.size()))
        throw ShapeError("DataProtoFuture::chunk: chunk " + std::to_string(i) + " of " + std::to_string(chunks) +
                         " is empty for a batch of " + std::to_string(d.size()) + " rows");
      return pieces[static_cast<size_t>(i)];
    }));
  return out;
}

DataProtoFuture DataProtoFuture::then(Transform next) const {
  if (!state_) throw ValueError("DataProtoFuture::then: empty future");
  DataProtoFuture out;
  out.state_ = std::make_shared<State>();
  out.state_->parent = state_;
  out.state_->transform = std::move(next);
  return out;
}

}  // namespace hyflow::dataproto
