#pragma once
// SharedResult<T>: a value (or an exception) set once by a producer thread, waited on by any
// number of consumers, with continuations that run when it is set. The state behind
// DataProtoFuture and the runtime's ValueFuture; plain C++, no CAF.

#include <hyflow/core/error.hpp>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace hyflow::dataproto::detail {

template <class T>
class SharedResult {
 public:
  using Callback = std::function<void()>;

  /// Sets the value; false (and nothing changes) when it was set before.
  bool set_value(T value) {
    return settle([&] { value_.emplace(std::move(value)); });
  }
  bool set_exception(std::exception_ptr error) {
    return settle([&] { error_ = std::move(error); });
  }

  bool ready() const {
    std::lock_guard lock(mutex_);
    return done_;
  }
  /// True when set before `deadline`.
  bool wait_until(std::chrono::steady_clock::time_point deadline) const {
    std::unique_lock lock(mutex_);
    return cv_.wait_until(lock, deadline, [this] { return done_; });
  }
  /// Waits; the value, or the producer's exception rethrown.
  const T& get() const {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(error_);
    return *value_;
  }
  /// Runs `fn` once the result is set: at once on this thread when it is, otherwise on the
  /// producer's thread right after it sets it. A continuation that throws is reported on
  /// stderr and ignored: it must not take the producer (a collector, a worker) down with it.
  void subscribe(Callback fn) {
    {
      std::lock_guard lock(mutex_);
      if (!done_) {
        callbacks_.push_back(std::move(fn));
        return;
      }
    }
    run(fn);
  }
  /// Hands the result, once set, to `on_value` (a copy of the value) or `on_error` (the
  /// producer's exception): what a future's then() runs from a subscribed continuation.
  template <class OnValue, class OnError>
  void deliver(OnValue& on_value, OnError& on_error) const {
    std::exception_ptr error;
    T value;
    try {
      value = get();
    } catch (...) {
      error = std::current_exception();
    }
    if (error)
      on_error(error);
    else
      on_value(std::move(value));
  }

 private:
  template <class Store>
  bool settle(Store store) {
    std::vector<Callback> callbacks;
    {
      std::lock_guard lock(mutex_);
      if (done_) return false;
      store();
      done_ = true;
      callbacks.swap(callbacks_);
    }
    cv_.notify_all();
    for (auto& fn : callbacks) run(fn);
    return true;
  }
  static void run(const Callback& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::cerr << "hyflow: a future continuation threw (ignored): " << e.what() << std::endl;
    } catch (...) {
      std::cerr << "hyflow: a future continuation threw a non-std exception (ignored)" << std::endl;
    }
  }

  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::optional<T> value_;
  std::exception_ptr error_;
  std::vector<Callback> callbacks_;
};

}  // namespace hyflow::dataproto::detail
