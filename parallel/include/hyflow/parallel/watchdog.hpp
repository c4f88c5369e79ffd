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

/// The rendezvous store as collectives see it (c10d's TCPStore behind ProcessGroup::store()).
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

/// Watches the collectives of one communicator. Each collective is registered when it is
/// enqueued with a `done` query (a CUDA event); a background thread polls them. When one is
/// not done `timeout` after it was enqueued, the watchdog calls `abort` once (ncclCommAbort,
/// which makes the stuck kernels return), and from then on check() and wait_all() throw
/// hyflow::Error naming the op, its sequence number, the group and the ranks that never
/// entered it. Ranks tell which collective they entered last through the store
/// ("<group>/progress/<rank>"), published by the watchdog thread off the caller's path.
class CollectiveWatchdog {
 public:
  struct Options {
    std::string group = "default";
    int rank = 0;
    int world_size = 1;
    std::chrono::milliseconds timeout{30000};
    std::chrono::milliseconds poll_interval{5};
  };
  /// `store` may be null (then the message cannot say who is missing).
  CollectiveWatchdog(Options options, KeyValueStore* store, std::function<void()> abort);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  /// Registers a collective just enqueued; returns its sequence number (1, 2, ...).
  /// Throws the failure if the watchdog has already aborted.
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
