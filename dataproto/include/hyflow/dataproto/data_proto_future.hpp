#pragma once
// DataProtoFuture: a DataProto that is not there yet. Non-blocking worker-group calls return
// one; it can be passed straight into the next call, waited on, or given a continuation that
// runs when the result arrives. CAF-free: the runtime fulfils a DataProtoPromise.
//
//   DataProtoFuture values = critic.call(CallOptions{.blocking = false}, &Critic::compute_values, batch);
//   values.then([](DataProto v) { use(v); }, [](std::exception_ptr e) { report(e); });

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/dataproto/detail/shared_result.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <vector>

namespace hyflow::dataproto {

class DataProtoPromise;

class DataProtoFuture {
 public:
  using Part = std::shared_future<DataProto>;
  /// Post-processing applied to the concatenated parts (e.g. un-padding, chunk selection).
  using Transform = std::function<DataProto(DataProto)>;
  using OnValue = std::function<void(DataProto)>;
  using OnError = std::function<void(std::exception_ptr)>;

  /// An empty future; valid() is false and get() throws ValueError.
  DataProtoFuture() = default;
  /// The concatenation of `parts` (in order), then `transform` if given (verl's
  /// DataProtoFuture.concat + dispatch_fn). std::shared_future has no completion hook: a
  /// continuation on such a future waits for the parts on a thread of its own. Futures of a
  /// DataProtoPromise (what the runtime returns) need none.
  explicit DataProtoFuture(std::vector<Part> parts, Transform transform = {});
  /// A future that is already resolved.
  static DataProtoFuture ready(DataProto value);

  bool valid() const { return state_ != nullptr; }
  /// True when every part has arrived (get() will not block).
  bool is_ready() const;
  /// Waits until every part has arrived or the deadline passes; true when all arrived.
  bool wait_for(std::chrono::milliseconds timeout) const;
  /// Waits, concatenates and transforms, once: later calls return the cached result (sharing
  /// storage). A part that failed rethrows its exception.
  DataProto get() const;

  /// Lazy chunks (verl's DataProtoFuture.chunk): future i resolves to get().chunk(chunks)[i],
  /// computing the parent's concatenation only once.
  std::vector<DataProtoFuture> chunk(int64_t chunks) const;
  /// A lazy transform: the returned future applies `next` to this one's result when its own
  /// result is asked for (get, or a continuation), once.
  DataProtoFuture map(Transform next) const;

  /// Continuation: runs `next` on the result as soon as it arrives (on the thread that
  /// completes this future, or at once when it is complete) and returns the future of what
  /// `next` returns. A failure of this future or of `next` fails the returned one.
  DataProtoFuture then(Transform next) const;
  /// Continuation: exactly one of the two runs once the result arrives, on the thread that
  /// completes this future (for a worker-group call: the group's collector thread; keep it
  /// short and never make a blocking call of the same runtime from it), or at once when
  /// complete. An exception escaping either is reported on stderr and dropped.
  void then(OnValue on_value, OnError on_error) const;

 private:
  friend class DataProtoPromise;
  struct State;
  /// Runs `fn` once the result is computed (computing it eagerly when the inputs arrive).
  void when_ready(std::function<void()> fn) const;
  std::shared_ptr<State> state_;
};

/// The producer's side of a DataProtoFuture: set the value (or the failure) once; the
/// futures' continuations run right then, on the setting thread.
class DataProtoPromise {
 public:
  DataProtoPromise();
  /// A future of this promise (any number; they share one result).
  DataProtoFuture get_future() const;
  /// False when the promise was already settled (the call has no effect then).
  bool set_value(DataProto value) const;
  bool set_exception(std::exception_ptr error) const;

 private:
  std::shared_ptr<detail::SharedResult<DataProto>> result_;
  std::shared_ptr<DataProtoFuture::State> state_;
};

}  // namespace hyflow::dataproto

namespace hyflow {
using dataproto::DataProtoFuture;
using dataproto::DataProtoPromise;
}  // namespace hyflow
