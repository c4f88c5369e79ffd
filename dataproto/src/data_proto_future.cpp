#include <hyflow/dataproto/data_proto_future.hpp>

#include <mutex>
#include <system_error>
#include <thread>

namespace hyflow::dataproto {

/// A root future (std::shared_future parts, or a promise's result) or a parent whose result
/// this one transforms lazily (chunk, map). The result is computed once and cached in
/// `result`, whose continuations run when it is set.
struct DataProtoFuture::State : std::enable_shared_from_this<State> {
  std::vector<Part> parts;
  std::shared_ptr<detail::SharedResult<DataProto>> source;
  std::shared_ptr<State> parent;
  Transform transform;
  detail::SharedResult<DataProto> result;
  std::once_flag once;
  std::once_flag watching;

  bool inputs_ready_by(std::chrono::steady_clock::time_point deadline) const {
    if (parent) return parent->inputs_ready_by(deadline);
    if (source) return source->wait_until(deadline);
    for (const auto& p : parts)
      if (p.wait_until(deadline) != std::future_status::ready) return false;
    return true;
  }

  void resolve() {
    std::call_once(once, [this] {
      try {
        DataProto joined;
        if (parent) {
          joined = parent->value();
        } else if (source) {
          joined = source->get();
        } else {
          std::vector<DataProto> values;
          values.reserve(parts.size());
          for (auto& p : parts) values.push_back(p.get());
          joined = values.size() == 1 ? std::move(values[0]) : DataProto::concat(values);
        }
        result.set_value(transform ? transform(std::move(joined)) : std::move(joined));
      } catch (...) {
        result.set_exception(std::current_exception());
      }
    });
  }

  const DataProto& value() {
    resolve();
    return result.get();
  }

  /// Arranges for resolve() to run as soon as the inputs are there (once).
  void watch_inputs() {
    std::call_once(watching, [this] {
      auto self = shared_from_this();
      auto go = [self] { self->resolve(); };
      if (parent) {
        parent->subscribe(go);
      } else if (source) {
        source->subscribe(go);
      } else if (inputs_ready_by(std::chrono::steady_clock::now())) {
        go();
      } else {
        // std::shared_future cannot notify: wait for the parts on a thread of our own.
        try {
          std::thread([self] {
            for (const auto& p : self->parts) p.wait();
            self->resolve();
          }).detach();
        } catch (const std::system_error&) {
          go();  // no thread to be had: wait here
        }
      }
    });
  }

  void subscribe(std::function<void()> fn) {
    watch_inputs();
    result.subscribe(std::move(fn));
  }
};

DataProtoFuture::DataProtoFuture(std::vector<Part> parts, Transform transform) : state_(std::make_shared<State>()) {
  if (parts.empty()) throw ValueError("DataProtoFuture: no parts");
  for (size_t i = 0; i < parts.size(); ++i)
    if (!parts[i].valid()) throw ValueError("DataProtoFuture: part " + std::to_string(i) + " is not a valid future");
  state_->parts = std::move(parts);
  state_->transform = std::move(transform);
}

DataProtoFuture DataProtoFuture::ready(DataProto value) {
  DataProtoPromise p;
  p.set_value(std::move(value));
  return p.get_future();
}

bool DataProtoFuture::is_ready() const {
  return wait_for(std::chrono::milliseconds(0));
}

bool DataProtoFuture::wait_for(std::chrono::milliseconds timeout) const {
  return state_ && state_->inputs_ready_by(std::chrono::steady_clock::now() + timeout);
}

DataProto DataProtoFuture::get() const {
  if (!state_) throw ValueError("DataProtoFuture::get: empty future");
  return state_->value();
}

std::vector<DataProtoFuture> DataProtoFuture::chunk(int64_t chunks) const {
  if (!state_) throw ValueError("DataProtoFuture::chunk: empty future");
  if (chunks <= 0) throw ValueError("DataProtoFuture::chunk: chunks must be positive, got " + std::to_string(chunks));
  std::vector<DataProtoFuture> out;
  out.reserve(static_cast<size_t>(chunks));
  for (int64_t i = 0; i < chunks; ++i)
    out.push_back(map([i, chunks](DataProto d) {
      auto pieces = d.chunk(chunks);
      if (i >= static_cast<int64_t>(pieces.size()))
        throw ShapeError("DataProtoFuture::chunk: chunk " + std::to_string(i) + " of " + std::to_string(chunks) +
                         " is empty for a batch of " + std::to_string(d.size()) + " rows");
      return pieces[static_cast<size_t>(i)];
    }));
  return out;
}

DataProtoFuture DataProtoFuture::map(Transform next) const {
  if (!state_) throw ValueError("DataProtoFuture::map: empty future");
  DataProtoFuture out;
  out.state_ = std::make_shared<State>();
  out.state_->parent = state_;
  out.state_->transform = std::move(next);
  return out;
}

void DataProtoFuture::when_ready(std::function<void()> fn) const {
  state_->subscribe(std::move(fn));
}

DataProtoFuture DataProtoFuture::then(Transform next) const {
  if (!state_) throw ValueError("DataProtoFuture::then: empty future");
  if (!next) throw ValueError("DataProtoFuture::then: empty continuation");
  DataProtoPromise promise;
  when_ready([state = state_, next = std::move(next), promise] {
    try {
      promise.set_value(next(state->result.get()));
    } catch (...) {
      promise.set_exception(std::current_exception());
    }
  });
  return promise.get_future();
}

void DataProtoFuture::then(OnValue on_value, OnError on_error) const {
  if (!state_) throw ValueError("DataProtoFuture::then: empty future");
  if (!on_value || !on_error) throw ValueError("DataProtoFuture::then: empty continuation");
  when_ready([state = state_, on_value = std::move(on_value), on_error = std::move(on_error)] {
    state->result.deliver(on_value, on_error);
  });
}

DataProtoPromise::DataProtoPromise()
    : result_(std::make_shared<detail::SharedResult<DataProto>>()), state_(std::make_shared<DataProtoFuture::State>()) {
  state_->source = result_;
}

DataProtoFuture DataProtoPromise::get_future() const {
  DataProtoFuture out;
  out.state_ = state_;
  return out;
}

bool DataProtoPromise::set_value(DataProto value) const {
  return result_->set_value(std::move(value));
}
bool DataProtoPromise::set_exception(std::exception_ptr error) const {
  return result_->set_exception(std::move(error));
}

}  // namespace hyflow::dataproto
