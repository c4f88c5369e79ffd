#include <hyflow/parallel/watchdog.hpp>

#include <hyflow/core/error.hpp>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

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

namespace {
/// begin()'s `done` query as an event that runs from registration on.
class QueryEvent : public CollectiveEvent {
 public:
  explicit QueryEvent(std::function<bool()> done) : done_(std::move(done)) {}
  State query() override { return done_() ? State::done : State::running; }

 private:
  std::function<bool()> done_;
};

using Clock = std::chrono::steady_clock;
}  // namespace

struct CollectiveWatchdog::State {
  struct Work {
    uint64_t seq;
    std::string op;
    std::shared_ptr<CollectiveEvent> event;
    std::optional<Clock::time_point> started;  // the first poll that saw it running
  };
  struct Launch {
    uint64_t seq;
    std::string op;
    Clock::time_point start;
  };
  Options options;
  KeyValueStore* store;
  std::function<void()> abort;
  mutable std::mutex mutex;
  std::condition_variable changed;
  std::deque<Work> pending;
  std::vector<Launch> launching;  // launches past the check, still enqueuing
  uint64_t next_seq = 1;
  uint64_t published = 0;
  std::string failure;
  Clock::time_point failed_at;
  bool described = false;  // the failure message is final
  bool stop = false;
  std::thread thread;

  std::string progress_key(int rank) const { return options.group + "/progress/" + std::to_string(rank); }

  std::string where() const {
    return "group '" + options.group + "' (rank " + std::to_string(options.rank) + " of " +
           std::to_string(options.world_size) + ")";
  }

  // Which ranks never entered collective #seq, from their published progress; stops reading at
  // `deadline` (a store that hangs must not hold the message forever).
  std::string describe(uint64_t seq, Clock::time_point deadline) const {
    if (!store) return "No store to ask which ranks arrived.";
    std::vector<int> missing, unread;
    std::string last;
    try {
      for (int r = 0; r < options.world_size; ++r) {
        if (r == options.rank) continue;
        if (Clock::now() >= deadline) {
          unread.push_back(r);
          continue;
        }
        auto value = store->try_get(progress_key(r));
        const uint64_t seen = value ? decode(*value) : 0;
        if (seen < seq) {
          missing.push_back(r);
          last += (last.empty() ? "rank " : ", rank ") + std::to_string(r) + " #" + std::to_string(seen);
        }
      }
    } catch (const std::exception& e) {
      return std::string("The store could not be read to tell which ranks arrived: ") + e.what();
    }
    std::ostringstream out;
    if (missing.empty() && unread.empty()) {
      out << "Every rank entered it: the collective itself hung (network, device, or mismatched calls).";
    } else if (!missing.empty()) {
      out << "Ranks that did not arrive: " << join(missing) << " (the last collective each entered: " << last << ").";
    }
    if (!unread.empty()) {
      out << (missing.empty() ? "" : " ") << "The store did not answer within " << options.describe_timeout.count()
          << " ms for ranks " << join(unread) << ".";
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

  // Records `message` as the failure, lets launches in flight finish (unless `hung_launch`),
  // aborts, then describes `seq` from the store. Called with `lock` held, on the watchdog thread.
  void fail(std::unique_lock<std::mutex>& lock, std::string message, uint64_t seq, bool hung_launch) {
    failure = std::move(message) + " The communicator was aborted.";
    failed_at = Clock::now();
    auto dropped = std::move(pending);  // destroyed on this thread, after the abort
    pending.clear();
    changed.notify_all();
    if (!hung_launch) changed.wait_for(lock, options.launch_grace, [&] { return launching.empty(); });
    const bool still_launching = !launching.empty();
    lock.unlock();
    std::string abort_error;
    try {
      if (abort) abort();
    } catch (const std::exception& e) {
      abort_error = std::string(" The abort itself failed: ") + e.what();
    }
    dropped.clear();
    const std::string who = seq ? describe(seq, Clock::now() + options.describe_timeout) : std::string();
    lock.lock();
    if (still_launching && !hung_launch) failure += " A launch was still being enqueued after the grace period.";
    failure += abort_error;
    if (!who.empty()) failure += " " + who;
    described = true;
    changed.notify_all();
  }

  // One pass over the launches and the oldest pending collective; `lock` held.
  void poll(std::unique_lock<std::mutex>& lock) {
    const auto now = Clock::now();
    for (const auto& l : launching) {
      if (now - l.start >= options.timeout) {
        fail(lock,
             "collective " + l.op + " #" + std::to_string(l.seq) + " of " + where() + " was still being enqueued " +
                 std::to_string(options.timeout.count()) + " ms after the launch began (the launch hung in the host).",
             l.seq, true);
        return;
      }
    }
    while (!pending.empty()) {
      auto event = pending.front().event;
      const uint64_t seq = pending.front().seq;
      CollectiveEvent::State state;
      std::string error;
      lock.unlock();
      try {
        state = event->query();
      } catch (const std::exception& e) {
        error = e.what();
        state = CollectiveEvent::State::done;
      }
      lock.lock();
      if (!failure.empty() || pending.empty() || pending.front().seq != seq) return;
      auto& front = pending.front();
      if (!error.empty()) {
        fail(lock,
             "collective " + front.op + " #" + std::to_string(seq) + " of " + where() +
                 " failed on the device: " + error + ".",
             seq, false);
        return;
      }
      if (state == CollectiveEvent::State::done) {
        pending.pop_front();
        changed.notify_all();
        continue;
      }
      if (state == CollectiveEvent::State::running && !front.started) front.started = Clock::now();
      if (front.started && Clock::now() - *front.started >= options.timeout) {
        fail(lock,
             "collective " + front.op + " #" + std::to_string(seq) + " of " + where() + " did not finish within " +
                 std::to_string(options.timeout.count()) + " ms of starting.",
             seq, false);
      }
      return;
    }
  }

  void run() {
    std::unique_lock lock(mutex);
    if (options.on_thread_start) {
      lock.unlock();
      std::string error;
      try {
        options.on_thread_start();
      } catch (const std::exception& e) {
        error = e.what();
      }
      lock.lock();
      if (!error.empty()) fail(lock, "the watchdog of " + where() + " could not start: " + error + ".", 0, false);
    }
    while (!stop) {
      const uint64_t latest = next_seq - 1;
      lock.unlock();
      publish(latest);
      lock.lock();
      if (failure.empty()) poll(lock);
      changed.wait_for(lock, options.poll_interval, [&] { return stop; });
    }
    auto left = std::move(pending);  // events are destroyed on this thread (its device is set)
    pending.clear();
    lock.unlock();
    left.clear();
  }

  // wait_all()'s end: throws the failure once its description is in (or its bound passed).
  [[noreturn]] void throw_failure(std::unique_lock<std::mutex>& lock) {
    changed.wait_until(lock, failed_at + options.launch_grace + options.describe_timeout, [&] { return described; });
    throw Error(failure);
  }
};

CollectiveWatchdog::CollectiveWatchdog(Options options, KeyValueStore* store, std::function<void()> abort)
    : state_(std::make_shared<State>()) {
  if (options.timeout.count() <= 0) {
    throw ValueError("CollectiveWatchdog: timeout must be > 0 ms, got " + std::to_string(options.timeout.count()));
  }
  if (options.poll_interval.count() <= 0) {
    throw ValueError("CollectiveWatchdog: poll_interval must be > 0 ms, got " +
                     std::to_string(options.poll_interval.count()));
  }
  if (options.launch_grace.count() < 0 || options.describe_timeout.count() < 0) {
    throw ValueError("CollectiveWatchdog: launch_grace and describe_timeout must be >= 0 ms");
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

uint64_t CollectiveWatchdog::launch(const std::string& op,
                                    const std::function<std::unique_ptr<CollectiveEvent>()>& enqueue) {
  auto& s = *state_;
  uint64_t seq = 0;
  {
    std::lock_guard lock(s.mutex);
    if (!s.failure.empty()) throw Error(s.failure);
    seq = s.next_seq++;
    s.launching.push_back({seq, op, Clock::now()});
  }
  auto finished = [&] {  // with s.mutex held
    std::erase_if(s.launching, [&](const State::Launch& l) { return l.seq == seq; });
    s.changed.notify_all();
  };
  std::shared_ptr<CollectiveEvent> event;
  try {
    event = enqueue();
  } catch (...) {
    std::lock_guard lock(s.mutex);
    finished();
    throw;
  }
  std::unique_lock lock(s.mutex);
  finished();
  if (!event) throw ValueError("CollectiveWatchdog::launch: " + op + " returned no event");
  if (!s.failure.empty()) {
    const std::string failure = s.failure;  // the watchdog thread may still be adding to it
    lock.unlock();
    event.reset();  // on the caller's thread, whose device the launch set
    throw Error(failure);
  }
  s.pending.push_back({seq, op, std::move(event), std::nullopt});
  return seq;
}

uint64_t CollectiveWatchdog::begin(const std::string& op, std::function<bool()> done) {
  return launch(op, [&] { return std::make_unique<QueryEvent>(std::move(done)); });
}

void CollectiveWatchdog::check() const {
  std::lock_guard lock(state_->mutex);
  if (!state_->failure.empty()) throw Error(state_->failure);
}

void CollectiveWatchdog::wait_all() {
  std::unique_lock lock(state_->mutex);
  state_->changed.wait(lock, [&] { return state_->pending.empty() || !state_->failure.empty(); });
  if (!state_->failure.empty()) state_->throw_failure(lock);
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
