#include <hyflow/parallel/watchdog.hpp>

#include <hyflow/core/error.hpp>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace hyflow::parallel {

// --- MemoryStore ---------------------------------------------------------------------------

struct MemoryStore::State {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::vector<uint8_t>> values;
};

MemoryStore::MemoryStore() : state_(std::make_unique<State>()) {}
MemoryStore::~MemoryStore() = default;

void MemoryStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard lock(state_->mutex);
    state_->values[key] = value;
  }
  state_->changed.notify_all();
}

std::vector<uint8_t> MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mutex);
  if (!state_->changed.wait_for(lock, timeout, [&] { return state_->values.count(key) > 0; })) {
    throw Error("store: key '" + key + "' did not appear within " + std::to_string(timeout.count()) + " ms");
  }
  return state_->values[key];
}

std::optional<std::vector<uint8_t>> MemoryStore::try_get(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->values.find(key);
  if (it == state_->values.end()) return std::nullopt;
  return it->second;
}

// --- rendezvous helpers --------------------------------------------------------------------

std::vector<uint8_t> exchange_unique_id(KeyValueStore& store, int rank, const std::string& key,
                                        const std::function<std::vector<uint8_t>()>& make_id,
                                        std::chrono::milliseconds timeout) {
  if (rank == 0) {
    auto id = make_id();
    store.set(key, id);
    return id;
  }
  try {
    return store.get(key, timeout);
  } catch (const Error& e) {
    throw Error("rank " + std::to_string(rank) + " got no communicator id from rank 0 under '" + key +
                "': " + e.what());
  }
}

namespace {
std::string join(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::vector<uint8_t> encode(uint64_t v) {
  return std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 8);
}

uint64_t decode(const std::vector<uint8_t>& b) {
  uint64_t v = 0;
  if (b.size() == 8) std::memcpy(&v, b.data(), 8);
  return v;
}
}  // namespace

void store_barrier(KeyValueStore& store, const std::string& prefix, int rank, int world_size,
                   std::chrono::milliseconds timeout) {
  store.set(prefix + "/" + std::to_string(rank), {1});
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::vector<int> missing;
    for (int r = 0; r < world_size; ++r) {
      if (!store.try_get(prefix + "/" + std::to_string(r))) missing.push_back(r);
    }
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error("rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " waited " +
                  std::to_string(timeout.count()) + " ms at '" + prefix +
                  "'; ranks that never arrived: " + join(missing));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// --- CollectiveWatchdog --------------------------------------------------------------------

struct CollectiveWatchdog::State {
  struct Work {
    uint64_t seq;
    std::string op;
    std::function<bool()> done;
    std::chrono::steady_clock::time_point start;
  };
  Options options;
  KeyValueStore* store;
  std::function<void()> abort;
  mutable std::mutex mutex;
  std::condition_variable changed;
  std::deque<Work> pending;
  uint64_t next_seq = 1;
  uint64_t published = 0;
  std::string failure;
  bool stop = false;
  std::thread thread;

  std::string progress_key(int rank) const { return options.group + "/progress/" + std::to_string(rank); }

  // The message for a timed-out collective, from the ranks' published progress.
  std::string describe(const Work& w) const {
    std::ostringstream out;
    out << "collective " << w.op << " #" << w.seq << " of group '" << options.group << "' (rank " << options.rank
        << " of " << options.world_size << ") did not finish within " << options.timeout.count()
        << " ms; the communicator was aborted. ";
    if (!store) return out.str() + "No store to ask which ranks arrived.";
    std::vector<int> missing;
    std::string last;
    try {
      for (int r = 0; r < options.world_size; ++r) {
        if (r == options.rank) continue;
        auto value = store->try_get(progress_key(r));
        const uint64_t seen = value ? decode(*value) : 0;
        if (seen < w.seq) {
          missing.push_back(r);
          last += (last.empty() ? "rank " : ", rank ") + std::to_string(r) + " #" + std::to_string(seen);
        }
      }
    } catch (const std::exception& e) {
      return out.str() + "The store could not be read to tell which ranks arrived: " + e.what();
    }
    if (missing.empty()) {
      out << "Every rank entered it: the collective itself hung (network, device, or mismatched calls).";
    } else {
      out << "Ranks that did not arrive: " << join(missing) << " (the last collective each entered: " << last << ").";
    }
    return out.str();
  }

  void publish(uint64_t seq) {
    if (!store || seq == published) return;
    try {
      store->set(progress_key(options.rank), encode(seq));
      published = seq;
    } catch (const std::exception&) {
      // the store is gone (rank 0 died): a later timeout message says so
    }
  }

  void run() {
    std::unique_lock lock(mutex);
    while (!stop) {
      const uint64_t latest = next_seq - 1;
      lock.unlock();
      publish(latest);
      lock.lock();
      while (!pending.empty() && failure.empty()) {
        auto& front = pending.front();
        bool done = false;
        lock.unlock();
        done = front.done();
        lock.lock();
        if (done) {
          pending.pop_front();
          changed.notify_all();
          continue;
        }
        if (std::chrono::steady_clock::now() - front.start >= options.timeout) {
          const Work stuck = front;
          lock.unlock();
          std::string message = describe(stuck);
          if (abort) abort();
          lock.lock();
          failure = std::move(message);
          pending.clear();
          changed.notify_all();
        }
        break;
      }
      changed.wait_for(lock, options.poll_interval, [&] { return stop; });
    }
  }
};

CollectiveWatchdog::CollectiveWatchdog(Options options, KeyValueStore* store, std::function<void()> abort)
    : state_(std::make_shared<State>()) {
  if (options.timeout.count() <= 0) {
    throw ValueError("CollectiveWatchdog: timeout must be > 0 ms, got " + std::to_string(options.timeout.count()));
  }
  state_->options = std::move(options);
  state_->store = store;
  state_->abort = std::move(abort);
  state_->thread = std::thread([s = state_.get()] { s->run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->changed.notify_all();
  state_->thread.join();
}

uint64_t CollectiveWatchdog::begin(const std::string& op, std::function<bool()> done) {
  std::lock_guard lock(state_->mutex);
  if (!state_->failure.empty()) throw Error(state_->failure);
  const uint64_t seq = state_->next_seq++;
  state_->pending.push_back({seq, op, std::move(done), std::chrono::steady_clock::now()});
  state_->changed.notify_all();
  return seq;
}

void CollectiveWatchdog::check() const {
  std::lock_guard lock(state_->mutex);
  if (!state_->failure.empty()) throw Error(state_->failure);
}

void CollectiveWatchdog::wait_all() {
  std::unique_lock lock(state_->mutex);
  state_->changed.wait(lock, [&] { return state_->pending.empty() || !state_->failure.empty(); });
  if (!state_->failure.empty()) throw Error(state_->failure);
}

std::size_t CollectiveWatchdog::pending() const {
  std::lock_guard lock(state_->mutex);
  return state_->pending.size();
}

bool CollectiveWatchdog::failed() const {
  std::lock_guard lock(state_->mutex);
  return !state_->failure.empty();
}

}  // namespace hyflow::parallel
