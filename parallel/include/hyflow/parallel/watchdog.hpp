#pragma once
// Collective bookkeeping that needs neither torch nor CUDA: the key-value store interface a
// process group rendezvouses through, the NCCL unique-id exchange over it, and the watchdog
// that aborts a communicator whose collective does not finish in time and says which ranks
// never arrived (the silent NCCL hang verl and OpenRLHF users meet most).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::parallel {

/// The rendezvous store as collectives see it (rendezvous_store.hpp behind ProcessGroup::store()).
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  /// Waits up to `timeout` for `key`; throws hyflow::Error naming the key when it never comes.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// The value when the key is present now, without waiting.
  virtual std::optional<std::vector<uint8_t>> try_get(const std::string& key) = 0;
};

/// A thread-safe in-process store (ranks as threads, and tests).
class MemoryStore : public KeyValueStore {
 public:
  MemoryStore();
  ~MemoryStore() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::vector<uint8_t>> try_get(const std::string& key) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Rank 0 calls `make_id` (ncclGetUniqueId) and publishes the bytes under `key`; every rank
/// returns them. Other ranks wait up to `timeout`; a timeout throws hyflow::Error naming the
/// key and the rank.
std::vector<uint8_t> exchange_unique_id(KeyValueStore& store, int rank, const std::string& key,
                                        const std::function<std::vector<uint8_t>()>& make_id,
                                        std::chrono::milliseconds timeout);

/// Every rank sets "<prefix>/<rank>" and waits until all `world_size` keys exist. A timeout
/// throws hyflow::Error listing the ranks that never arrived.
void store_barrier(KeyValueStore& store, const std::string& prefix, int rank, int world_size,
                   std::chrono::milliseconds timeout);

/// One enqueued collective as the watchdog sees it. The NCCL communicator hands it two CUDA events,
/// one recorded on the stream before the kernel and one after; tests hand fakes.
class CollectiveEvent {
 public:
  enum class State {
    queued,   ///< earlier work on its stream has not finished: the collective has not started
    running,  ///< started, not finished
    done,
  };
  virtual ~CollectiveEvent() = default;
  /// Where the collective is. Throws (any std::exception) when the device reports an error: the
  /// watchdog counts that as a failure of the collective, never as "done". Called on the
  /// watchdog thread only, after Options::on_thread_start.
  virtual State query() = 0;
};

/// Watches the collectives of one communicator and orders their launches against its abort.
///
/// A collective goes through launch(): the watchdog refuses it once a failure is recorded, and
/// counts it as "being enqueued" while the launch callback runs. A background thread polls the
/// events. When a collective has been running for `timeout` (measured from the first poll that sees
/// its start event done, i.e. from when it started on the device, not from when it was enqueued:
/// ranks reach a collective at different times and that is no failure), or its event reports a
/// device error, or a launch itself has been blocked in the host for `timeout`, the watchdog
///  1. records the failure (from then on launch(), begin(), check() and wait_all() throw it),
///  2. waits for launches already past the check to finish enqueuing (at most `launch_grace`;
///     a launch hung in the host is not waited for: ncclCommAbort is what frees it),
///  3. calls `abort` once (ncclCommAbort, which makes the stuck kernels return),
///  4. and only then reads the store to say which ranks never entered the collective, stopping
///     after `describe_timeout`; wait_all() waits at most launch_grace + describe_timeout for that
///     description before it throws the failure as recorded so far.
/// So no caller enqueues on an aborted communicator, and a store that hangs (the network being the
/// problem) cannot delay the abort. Ranks tell which collective they entered last through the store
/// ("<group>/progress/<rank>"), published by the watchdog thread off the caller's path.
class CollectiveWatchdog {
 public:
  struct Options {
    std::string group = "default";
    int rank = 0;
    int world_size = 1;
    /// How long a collective may run (verl's and PyTorch's NCCL default: 600 s).
    std::chrono::milliseconds timeout{600000};
    std::chrono::milliseconds poll_interval{5};
    /// How long the abort waits for launches already being enqueued.
    std::chrono::milliseconds launch_grace{5000};
    /// The bound on the store reads that name the missing ranks, after the abort.
    std::chrono::milliseconds describe_timeout{5000};
    /// Runs first on the watchdog thread (NCCL: cudaSetDevice to the communicator's device, so
    /// that event queries and destruction do not create a context on device 0). Events are
    /// queried and destroyed on that thread only. A throw is recorded as the failure.
    std::function<void()> on_thread_start;
  };
  /// `store` may be null (then the message cannot say who is missing).
  CollectiveWatchdog(Options options, KeyValueStore* store, std::function<void()> abort);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  /// Enqueues one collective: throws the recorded failure, if any, without calling `enqueue`;
  /// otherwise calls `enqueue` (which launches the collective and returns its event) with the
  /// guarantee that the communicator is not aborted while it runs (see the class comment for the
  /// one exception, a launch hung for `timeout`). Returns the sequence number (1, 2, ...). When
  /// the watchdog failed while `enqueue` ran, throws the failure (the collective was aborted).
  uint64_t launch(const std::string& op, const std::function<std::unique_ptr<CollectiveEvent>()>& enqueue);
  /// Registers a collective already enqueued whose `done` query the watchdog polls (running from
  /// now on). Throws the failure if the watchdog has already aborted.
  uint64_t begin(const std::string& op, std::function<bool()> done);
  /// Throws the recorded failure, if any.
  void check() const;
  /// Blocks until every registered collective is done; throws if the watchdog fails meanwhile.
  void wait_all();
  /// Collectives registered and not yet seen done.
  std::size_t pending() const;
  bool failed() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace hyflow::parallel
