#pragma once
// DataProtoFuture: a DataProto that is not there yet. Non-blocking worker-group calls return
// one; it can be passed straight into the next call. CAF-free: parts are std::shared_futures
// that the runtime fulfils.

#include <hyflow/dataproto/data_proto.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <vector>

namespace hyflow::dataproto {

class DataProtoFuture {
 public:
  using Part = std::shared_future<DataProto>;
  /// Post-processing applied to the concatenated parts (e.g. un-padding, chunk selection).
  using Transform = std::function<DataProto(DataProto)>;

  /// An empty future; valid() is false and get() throws ValueError.
  DataProtoFuture() = default;
  /// The concatenation of `parts` (in order), then `transform` if given (verl's
  /// DataProtoFuture.concat + dispatch_fn).
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
  /// A future applying `next` after this one's transform.
  DataProtoFuture then(Transform next) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace hyflow::dataproto

namespace hyflow {
using dataproto::DataProtoFuture;
}  // namespace hyflow
