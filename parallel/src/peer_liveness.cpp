#include <hyflow/parallel/peer_liveness.hpp>

#include <hyflow/core/error.hpp>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace hyflow::parallel {

namespace {
std::vector<uint8_t> encode(uint64_t v) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
  return out;
}
std::optional<uint64_t> decode(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != 8) return std::nullopt;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return v;
}
}  // namespace

struct PeerLiveness::State {
  Options options;
  std::unique_ptr<KeyValueStore> store;
  std::function<void(const std::string&)> on_failure;
  mutable std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::optional<std::string> failure;
  std::thread thread;

  std::string key(int rank) const { return options.group + "/alive/" + std::to_string(rank); }

  /// "; it ran on node host:port, with ranks 2, 3 of the group" when rank r's node is known.
  std::string node_of(int r) const {
    const auto& nodes = options.nodes;
    if (static_cast<size_t>(r) >= nodes.size() || nodes[static_cast<size_t>(r)].empty()) return "";
    std::string ranks;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i] == nodes[static_cast<size_t>(r)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(i);
    return "; it ran on node " + nodes[static_cast<size_t>(r)] + ", which holds ranks " + ranks + " of the group";
  }

  void fail(std::string message) {
    {
      std::lock_guard lock(mutex);
      if (failure || stopping) return;
      failure = message;
    }
    if (on_failure) on_failure(message);
  }

  void run() {
    const auto& o = options;
    const uint64_t rounds_allowed =
        std::max<uint64_t>(2, static_cast<uint64_t>((o.timeout.count() + o.interval.count() - 1) / o.interval.count()));
    std::vector<uint64_t> last_value(o.world_size, 0);
    std::vector<uint64_t> last_change(o.world_size, 0);  // in own rounds
    std::vector<bool> seen(o.world_size, false);
    uint64_t round = 0;
    uint64_t store_errors = 0;
    std::chrono::steady_clock::time_point failing_since;  // start of the first failing store round
    std::string last_error;
    std::unique_lock lock(mutex);
    while (!stopping && !failure) {
      lock.unlock();
      ++round;
      const auto round_start = std::chrono::steady_clock::now();
      try {
        store->set(key(o.rank), encode(round));
        for (int r = 0; r < o.world_size; ++r) {
          if (r == o.rank) continue;
          auto bytes = store->try_get(key(r));
          auto value = bytes ? decode(*bytes) : std::nullopt;
          if (value && (!seen[r] || *value != last_value[r])) {
            seen[r] = true;
            last_value[r] = *value;
            last_change[r] = round;
          }
        }
        store_errors = 0;
      } catch (const std::exception& e) {
        if (store_errors++ == 0) failing_since = round_start;
        last_error = e.what();
      }
      // A store operation may block until its own timeout, so the store's silence is measured in
      // time, and only while every round fails (a failing operation is evidence, not starvation).
      if (store_errors >= 2 && std::chrono::steady_clock::now() - failing_since >= o.timeout) {
        fail("the store of group '" + o.group + "' at " + o.store_address +
             " (in rank 0's process) has been unreachable for " + std::to_string(o.timeout.count()) +
             " ms: rank 0 is dead, stopped or cut off (" + last_error + ")" + node_of(0));
      } else if (store_errors == 0) {
        for (int r = 0; r < o.world_size; ++r) {
          if (r == o.rank || round - last_change[r] < rounds_allowed) continue;
          fail("rank " + std::to_string(r) + " of group '" + o.group + "' (" + std::to_string(o.world_size) +
               " ranks) has not signalled for " + std::to_string(o.timeout.count()) + " ms" +
               (seen[r] ? "" : " (it never did)") + ": its process is dead, stopped or cut off (seen from rank " +
               std::to_string(o.rank) + ")" + node_of(r));
          break;
        }
      }
      lock.lock();
      wake.wait_for(lock, o.interval, [&] { return stopping; });
    }
  }
};

PeerLiveness::PeerLiveness(Options options, std::unique_ptr<KeyValueStore> store,
                           std::function<void(const std::string&)> on_failure)
    : state_(std::make_shared<State>()) {
  if (options.interval.count() <= 0 || options.timeout < options.interval)
    throw ValueError("PeerLiveness: needs 0 < interval <= timeout, got interval " +
                     std::to_string(options.interval.count()) + " ms and timeout " +
                     std::to_string(options.timeout.count()) + " ms");
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size)
    throw ValueError("PeerLiveness: rank " + std::to_string(options.rank) + " is outside world size " +
                     std::to_string(options.world_size));
  if (!store) throw ValueError("PeerLiveness: needs a store");
  state_->options = std::move(options);
  state_->store = std::move(store);
  state_->on_failure = std::move(on_failure);
  state_->thread = std::thread([s = state_.get()] { s->run(); });
}

PeerLiveness::~PeerLiveness() {
  stop();
  if (state_->thread.joinable()) state_->thread.join();
}

void PeerLiveness::stop() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
}

std::optional<std::string> PeerLiveness::failure() const {
  std::lock_guard lock(state_->mutex);
  return state_->failure;
}

}  // namespace hyflow::parallel
