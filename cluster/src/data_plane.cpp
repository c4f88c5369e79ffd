// The data plane's TCP server and client (see data_plane.hpp for the protocol). Sockets come
// from net.hpp: every wait goes through poll() with the io_timeout, so no operation can hang.
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/dataproto/serialization.hpp>

#include "crypto.hpp"
#include "net.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <type_traits>

namespace hyflow::cluster {

namespace {

using Clock = net::Clock;
constexpr char kMagic[4] = {'H', 'F', 'O', 'B'};
constexpr uint8_t kOpFetch = 1, kOpDiscard = 2;
constexpr uint8_t kStatusOk = 0, kStatusUnknown = 1, kStatusEncodeFailed = 2, kStatusBadToken = 3, kStatusBusy = 4;
constexpr size_t kIdBytes = 16;
constexpr size_t kTokenBytes = 16;
constexpr size_t kRequestBytes = 4 + 1 + kIdBytes + kTokenBytes;
constexpr const char* kRefKey = "$hyflow_object";

using net::Fd;

std::string random_id() {
  unsigned char id[kIdBytes];
  crypto::random_bytes(id, sizeof id, "a random object id");
  return crypto::to_hex(id, sizeof id);
}

void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

/// An empty vector with capacity for `n` bytes. Large ones ask for transparent huge pages, so
/// that first touching them costs a few faults instead of one per 4 KiB page.
std::vector<char> reserve_buffer(size_t n) {
  std::vector<char> v;
  v.reserve(n);
  constexpr uintptr_t huge = uintptr_t{2} << 20;
  if (n >= 2 * huge) {
    const auto begin = (reinterpret_cast<uintptr_t>(v.data()) + huge - 1) & ~(huge - 1);
    const auto end = (reinterpret_cast<uintptr_t>(v.data()) + n) & ~(huge - 1);
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
  return v;
}

std::atomic<uint64_t> client_fetches{0};
std::atomic<uint64_t> client_fetched_bytes{0};

std::string describe(const ObjectRef& ref) { return "data plane object " + ref.id + " at " + ref.address(); }

/// The token's bytes (zeros for an empty token); false when it is not 32 hex digits.
bool token_bytes(const std::string& token, unsigned char* out) {
  if (token.empty()) {
    std::memset(out, 0, kTokenBytes);
    return true;
  }
  return crypto::from_hex(token, out, kTokenBytes);
}

/// Sends one request; returns the connected socket for the reply. NetError when the connection
/// or the send fails; DataPlaneError for a malformed id or token.
Fd request(const ObjectRef& ref, uint8_t op, std::chrono::milliseconds timeout, const std::string& token) {
  const std::string what = describe(ref);
  unsigned char id[kIdBytes], tok[kTokenBytes];
  if (!crypto::from_hex(ref.id, id, kIdBytes)) throw DataPlaneError(what + ": the id is not 32 hex digits");
  if (!token_bytes(token, tok)) throw DataPlaneError(what + ": the data plane token is not 32 hex digits");
  Fd fd;
  try {
    fd = net::connect_tcp(ref.host, ref.port, {.each_wait = timeout});
  } catch (const net::NetError& e) {
    throw DataPlaneError(what + ": cannot connect: " + e.what());
  }
  char req[kRequestBytes];
  std::memcpy(req, kMagic, 4);
  req[4] = static_cast<char>(op);
  std::memcpy(req + 5, id, kIdBytes);
  std::memcpy(req + 5 + kIdBytes, tok, kTokenBytes);
  net::write_all(fd.get(), req, sizeof req, {.each_wait = timeout});
  return fd;
}

/// Attempts of one request whose connection the holder closed or reset before answering.
constexpr int kRequestAttempts = 32;

/// Runs `exchange` (send a request, read the reply) until it succeeds or fails for a reason
/// other than a connection the holder dropped unanswered. Only that case is repeated: the holder
/// takes an object only while answering, so a request that got no byte back (a send the peer
/// reset, or a reply that closed or reset at 0 bytes) was never served. A holder flooded with
/// connections sheds unfinished ones (Impl::make_room); this request gets another turn after
/// 10 ms, doubling up to 160 ms, within `timeout` in all and at most kRequestAttempts times.
/// NetError of the last attempt becomes a DataPlaneError naming `what`.
template <class F>
auto with_retries(const std::string& what, std::chrono::milliseconds timeout, F&& exchange) {
  const auto give_up = Clock::now() + timeout;
  auto pause = std::chrono::milliseconds(10);
  for (int attempt = 1;; ++attempt) {
    try {
      return exchange();
    } catch (const net::NetError& e) {
      const bool unanswered = e.kind() == net::NetError::Kind::closed && e.transferred() == 0;
      if (!unanswered || attempt == kRequestAttempts || Clock::now() + pause >= give_up)
        throw DataPlaneError(what + ": " + e.what() +
                             (attempt > 1 ? " (attempt " + std::to_string(attempt) + ")" : std::string()));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(160));
  }
}

}  // namespace

// ---- ObjectRef --------------------------------------------------------------------------------

Json ObjectRef::to_json() const {
  return Json{{kRefKey, Json{{"host", host}, {"port", port}, {"id", id}, {"size", size}}}};
}

ObjectRef ObjectRef::from_json(const Json& j) {
  if (!j.is_object() || !j.contains(kRefKey) || !j.at(kRefKey).is_object())
    throw FormatError(std::string("not a data plane handle (no '") + kRefKey + "' object): " + j.dump().substr(0, 200));
  const Json& h = j.at(kRefKey);
  ObjectRef r;
  try {
    r.host = h.at("host").get<std::string>();
    r.port = h.at("port").get<int>();
    r.id = h.at("id").get<std::string>();
    r.size = h.at("size").get<uint64_t>();
  } catch (const Json::exception& e) {
    throw FormatError(std::string("data plane handle: ") + e.what() + " in " + h.dump());
  }
  return r;
}

// ---- options ----------------------------------------------------------------------------------

DataPlaneOptions DataPlaneOptions::from_environment() { return from_environment(DataPlaneOptions{}); }

DataPlaneOptions DataPlaneOptions::from_environment(DataPlaneOptions o) {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  auto number = [](const char* name, const std::string& text) -> uint64_t {
    try {
      size_t used = 0;
      auto v = std::stoull(text, &used);
      if (used != text.size()) throw std::invalid_argument("trailing");
      return v;
    } catch (const std::exception&) {
      throw ValueError(std::string(name) + "='" + text + "' is not a non-negative integer");
    }
  };
  if (auto v = env("HYFLOW_DATA_PLANE"); !v.empty()) {
    if (v == "off" || v == "0") o.enabled = false;
    else if (v == "on" || v == "1") o.enabled = true;
    else throw ValueError("HYFLOW_DATA_PLANE='" + v + "' must be on or off");
  }
  if (auto v = env("HYFLOW_DATA_PLANE_WITH_TLS"); !v.empty()) {
    if (v == "1" || v == "on") o.with_tls = true;
    else if (v == "0" || v == "off") o.with_tls = false;
    else throw ValueError("HYFLOW_DATA_PLANE_WITH_TLS='" + v + "' must be on or off");
  }
  if (auto v = env("HYFLOW_DATA_PLANE_BIND"); !v.empty()) o.bind = v;
  if (auto v = env("HYFLOW_DATA_PLANE_HOST"); !v.empty()) o.advertise = v;
  if (auto v = env("HYFLOW_DATA_PLANE_THRESHOLD"); !v.empty())
    o.threshold_bytes = static_cast<size_t>(number("HYFLOW_DATA_PLANE_THRESHOLD", v));
  if (auto v = env("HYFLOW_DATA_PLANE_TIMEOUT_MS"); !v.empty()) {
    o.io_timeout = std::chrono::milliseconds(number("HYFLOW_DATA_PLANE_TIMEOUT_MS", v));
    if (o.io_timeout.count() <= 0) throw ValueError("HYFLOW_DATA_PLANE_TIMEOUT_MS must be positive");
  }
  if (auto v = env("HYFLOW_DATA_PLANE_TTL_MS"); !v.empty())
    o.object_ttl = std::chrono::milliseconds(number("HYFLOW_DATA_PLANE_TTL_MS", v));
  return o;
}

// ---- server -----------------------------------------------------------------------------------

struct DataPlane::Impl {
  /// Encoded bytes, or a DataProto encoded when fetched (so that encoding on this side
  /// overlaps with the fetcher preparing its buffer, and nothing is copied while it waits).
  using Token = std::array<unsigned char, kTokenBytes>;
  struct Object {
    std::shared_ptr<std::vector<char>> bytes;
    std::shared_ptr<const DataProto> data;
    uint64_t size = 0;
    Clock::time_point expires;
    bool job = false;  ///< stored for one job: only `token` may fetch or discard it
    Token token{};
  };
  /// Buffers of objects already sent, kept for the next put (their pages are mapped: encoding
  /// into them is one memcpy, without page faults).
  static constexpr size_t kSpareBuffers = 2;
  std::vector<std::vector<char>> spare;

  void recycle_locked(std::shared_ptr<std::vector<char>>& bytes) {
    if (bytes && bytes.use_count() == 1 && bytes->capacity() >= options.threshold_bytes && spare.size() < kSpareBuffers)
      spare.push_back(std::move(*bytes));
    bytes.reset();
  }
  DataPlaneOptions options;
  std::string advertise;
  Fd listener;
  std::optional<net::Waker> waker;  ///< stops the accept loop
  int port = 0;
  mutable std::mutex mutex;
  std::map<std::string, Object> objects;
  DataPlaneStats stats;
  std::thread acceptor;
  /// Requests being served (one detached thread each, bounded by io_timeout per operation).
  static constexpr int kMaxConnections = 64;
  int active = 0;
  std::condition_variable idle;
  std::atomic<bool> stopping{false};

  void expire_locked(Clock::time_point now) {
    for (auto it = objects.begin(); it != objects.end();) {
      if (it->second.expires <= now) {
        ++stats.expired;
        it = erase_locked(it);
      } else {
        ++it;
      }
    }
  }

  /// Job tokens this server stores (or recently stored) objects for: a request carrying one
  /// passes the door. Compared in constant time, every entry (no early exit).
  struct JobToken {
    Token token{};
    size_t held = 0;    ///< objects stored under it now
    uint64_t last = 0;  ///< when it was last used to store one
  };
  static constexpr size_t kIdleJobTokens = 256;  ///< tokens without objects that are remembered
  std::vector<JobToken> job_tokens;
  uint64_t token_clock = 0;

  JobToken* find_job_token_locked(const unsigned char* t) {
    JobToken* found = nullptr;
    for (auto& j : job_tokens)
      if (crypto::equal_in_constant_time(j.token.data(), t, kTokenBytes)) found = &j;
    return found;
  }
  void hold_job_token_locked(const Token& t) {
    JobToken* j = find_job_token_locked(t.data());
    if (!j) j = &job_tokens.emplace_back(JobToken{t});
    ++j->held;
    j->last = ++token_clock;
    prune_job_tokens_locked();
  }
  void prune_job_tokens_locked() {
    for (;;) {
      size_t idle_count = 0;
      auto oldest = job_tokens.end();
      for (auto it = job_tokens.begin(); it != job_tokens.end(); ++it)
        if (it->held == 0) {
          ++idle_count;
          if (oldest == job_tokens.end() || it->last < oldest->last) oldest = it;
        }
      if (idle_count <= kIdleJobTokens) return;
      job_tokens.erase(oldest);
    }
  }
  /// Removes a stored object (its job token stays known for a while).
  std::map<std::string, Object>::iterator erase_locked(std::map<std::string, Object>::iterator it) {
    if (it->second.job)
      if (JobToken* j = find_job_token_locked(it->second.token.data()); j && j->held > 0) --j->held;
    return objects.erase(it);
  }
  /// Whether `t` may fetch or discard `o`.
  bool may_take_locked(const Object& o, const unsigned char* t) const {
    if (o.job) return crypto::equal_in_constant_time(o.token.data(), t, kTokenBytes);
    return !check_token || crypto::equal_in_constant_time(token, t, kTokenBytes);
  }
  /// An object to store, with `job_token` (hex; empty: the server's own token) as its key.
  Object make_object(const std::string& job_token) {
    Object o;
    if (job_token.empty()) return o;
    if (!crypto::from_hex(job_token, o.token.data(), kTokenBytes))
      throw ValueError("data plane job token '" + job_token + "' is not 32 hex digits (job_data_plane_token)");
    o.job = true;
    return o;
  }
  void store_locked(const std::string& id, Object o) {
    if (o.job) hold_job_token_locked(o.token);
    objects[id] = std::move(o);
    ++stats.put;
  }
  /// Stores `o` (`size` bytes encoded) under a fresh random id: the handle that fetches it.
  ObjectRef store(Object o, uint64_t size, bool expires) {
    ObjectRef ref;
    ref.host = advertise;
    ref.port = port;
    ref.id = random_id();
    ref.size = size;
    o.size = size;
    o.expires = expires ? Clock::now() + options.object_ttl : Clock::time_point::max();
    std::lock_guard lock(mutex);
    store_locked(ref.id, std::move(o));
    return ref;
  }

  /// Accepted connections whose request is not complete yet: no thread, no buffer beyond the
  /// request's 37 bytes. At most kMaxPending (the oldest goes first); each gets
  /// request_timeout to send its request.
  struct Pending {
    Fd fd;
    Clock::time_point deadline;
    char req[kRequestBytes] = {};
    size_t got = 0;
  };
  static constexpr size_t kMaxPending = 256;
  std::vector<Pending> pending;
  unsigned char token[kTokenBytes] = {};
  bool check_token = false;  ///< guarded by mutex

  /// A 9-byte refusal (status, zero size) on a fresh socket, then close.
  static void refuse(Fd fd, uint8_t status) {
    char head[1 + 8] = {static_cast<char>(status)};
    net::send_now(fd.get(), head, sizeof head);
  }

  /// The request of `p` is complete: check it and hand it to a serving thread.
  void dispatch(Pending& p) {
    const uint8_t op = static_cast<uint8_t>(p.req[4]);
    if (std::memcmp(p.req, kMagic, 4) != 0 || (op != kOpFetch && op != kOpDiscard)) return;  // not ours: hang up
    std::unique_lock lock(mutex);
    const auto* request_token = reinterpret_cast<const unsigned char*>(p.req + 5 + kIdBytes);
    if (check_token && !crypto::equal_in_constant_time(request_token, token, kTokenBytes) &&
        !find_job_token_locked(request_token)) {
      ++stats.refused;
      ++stats.bad_token;
      lock.unlock();
      refuse(std::move(p.fd), kStatusBadToken);
      return;
    }
    if (active >= kMaxConnections) {  // transfers in progress: say so instead of hanging up
      ++stats.refused;
      lock.unlock();
      refuse(std::move(p.fd), kStatusBusy);
      return;
    }
    ++active;
    lock.unlock();
    std::string req(p.req, kRequestBytes);
    const int fd = p.fd.get();
    try {
      std::thread([this, fd, req]() mutable {
        serve(Fd(fd), req);
        std::lock_guard lock(mutex);
        if (--active == 0) idle.notify_all();
      }).detach();
      p.fd.release();  // the thread owns it
    } catch (const std::system_error&) {  // no thread to be had: busy, as when all are taken
      {
        std::lock_guard relock(mutex);
        ++stats.refused;
        if (--active == 0) idle.notify_all();
      }
      refuse(std::move(p.fd), kStatusBusy);
    }
  }

  /// A flood (churn) filled the pending connections. Every complete request that has arrived is
  /// served first: a request that authenticates with its token is never evicted to make room.
  /// Then, if still full, the oldest eighth of the unfinished ones go (closed), so that the next
  /// connections find room without another sweep.
  void make_room() {
    std::vector<Pending> still;
    for (auto& q : pending)
      if (!progress(q)) still.push_back(std::move(q));
    pending.swap(still);
    if (pending.size() < kMaxPending) return;
    const size_t shed = kMaxPending / 8;
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(shed));
    std::lock_guard lock(mutex);
    stats.timed_out += shed;
  }

  /// Reads what `p` sent; true when it is finished with (dispatched or closed).
  bool progress(Pending& p) {
    switch (net::read_available(p.fd.get(), p.req, kRequestBytes, p.got)) {
      case net::ReadState::partial: return false;
      case net::ReadState::complete: dispatch(p); return true;
      case net::ReadState::closed: return true;  // closed or failed: drop
    }
    return true;
  }

  void accept_loop() {
    std::vector<pollfd> fds;
    while (!stopping) {
      fds.clear();
      fds.push_back({listener.get(), POLLIN, 0});
      fds.push_back({waker->fd(), POLLIN, 0});
      int timeout = 1000;  // expiry of stored objects at least once a second
      const auto now = Clock::now();
      for (auto& p : pending) {
        fds.push_back({p.fd.get(), POLLIN, 0});
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(p.deadline - now).count();
        timeout = std::min<int>(timeout, static_cast<int>(std::max<int64_t>(left, 0)));
      }
      int rc = ::poll(fds.data(), fds.size(), timeout);
      {
        std::lock_guard lock(mutex);
        expire_locked(Clock::now());
      }
      if (rc < 0 && errno != EINTR) break;
      if (stopping || (rc > 0 && (fds[1].revents & POLLIN))) continue;
      std::vector<Pending> still;
      const auto then = Clock::now();
      for (size_t i = 0; i < pending.size(); ++i) {
        auto& p = pending[i];
        if (rc > 0 && fds[i + 2].revents && progress(p)) continue;
        if (then >= p.deadline) {  // an idle connection: it never said what it wants
          std::lock_guard lock(mutex);
          ++stats.timed_out;
          continue;
        }
        still.push_back(std::move(p));
      }
      pending.swap(still);
      if (rc <= 0 || !(fds[0].revents & POLLIN)) continue;
      for (;;) {
        Fd c = net::accept_one(listener.get());
        if (!c) break;
        Pending p;
        p.fd = std::move(c);
        p.deadline = Clock::now() + options.request_timeout;
        if (progress(p)) continue;  // the request came with the connection: served at once
        if (pending.size() >= kMaxPending) make_room();
        pending.push_back(std::move(p));
      }
    }
    pending.clear();
  }

  /// An empty buffer with room for `n` bytes: a spare one when large enough, else fresh.
  std::vector<char> take_buffer(size_t n) {
    {
      std::lock_guard lock(mutex);
      for (auto it = spare.begin(); it != spare.end(); ++it)
        if (it->capacity() >= n) {
          std::vector<char> out = std::move(*it);
          spare.erase(it);
          return out;
        }
    }
    return reserve_buffer(n);
  }

  void give_back(std::shared_ptr<std::vector<char>>& bytes) {
    std::lock_guard lock(mutex);
    recycle_locked(bytes);
  }

  /// One checked request on one connection. Errors only end this connection.
  void serve(Fd fd, const std::string& req) {
    const net::Timeouts timeouts{.each_wait = options.io_timeout};
    try {
      const uint8_t op = static_cast<uint8_t>(req[4]);
      const std::string id = crypto::to_hex(req.data() + 5, kIdBytes);
      const auto* request_token = reinterpret_cast<const unsigned char*>(req.data() + 5 + kIdBytes);
      std::optional<Object> object;
      bool refused = false;
      {
        std::lock_guard lock(mutex);
        auto it = objects.find(id);
        if (it == objects.end()) {
          ++stats.unknown;
        } else if (!may_take_locked(it->second, request_token)) {
          ++stats.refused;  // another job's object (or not the cluster's token): it stays
          ++stats.bad_token;
          refused = true;
        } else {
          object = std::move(it->second);  // one consumer: freed once handed out
          erase_locked(it);                // reads only `job` and `token`, which the move copied
          if (op == kOpFetch) {
            ++stats.fetched;
            stats.bytes_served += object->size;
          } else {
            ++stats.released;
          }
        }
      }
      if (refused) {
        char head[1 + 8] = {static_cast<char>(kStatusBadToken)};
        net::write_all(fd.get(), head, op == kOpDiscard ? 1 : sizeof head, timeouts);
        return;
      }
      if (op == kOpDiscard) {
        const char status = static_cast<char>(object ? kStatusOk : kStatusUnknown);
        if (object) give_back(object->bytes);
        net::write_all(fd.get(), &status, 1, timeouts);
        return;
      }
      char head[1 + 8] = {static_cast<char>(kStatusUnknown)};
      if (object && object->data) {
        try {
          auto buf = std::make_shared<std::vector<char>>(take_buffer(object->size));
          dataproto::serialize_into(*object->data, *buf);
          object->data.reset();
          if (buf->size() != object->size) throw FormatError("encoded size changed since put");
          object->bytes = std::move(buf);
        } catch (const std::exception&) {
          head[0] = static_cast<char>(kStatusEncodeFailed);
          net::write_all(fd.get(), head, sizeof head, timeouts);
          return;
        }
      }
      if (object) {
        head[0] = static_cast<char>(kStatusOk);
        put_u64(head + 1, object->size);
      }
      net::write_all(fd.get(), head, sizeof head, timeouts);
      if (object) net::write_all(fd.get(), object->bytes->data(), object->bytes->size(), timeouts);
      if (object) give_back(object->bytes);
    } catch (const std::exception&) {
      // The client sees the broken connection (short read / timeout) and reports it.
    }
  }
};

DataPlane::DataPlane(DataPlaneOptions options) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.options = std::move(options);
  if (im.options.io_timeout.count() <= 0) throw ValueError("DataPlaneOptions::io_timeout must be positive");
  if (im.options.request_timeout.count() <= 0) throw ValueError("DataPlaneOptions::request_timeout must be positive");
  require_token(im.options.token);
  const std::string where = "data plane on " + im.options.bind + ":" + std::to_string(im.options.port);
  const std::string bind_host = im.options.bind == "localhost" ? "127.0.0.1" : im.options.bind;
  try {
    im.listener = net::listen_tcp(bind_host, im.options.port, 512);
    im.waker.emplace();
  } catch (const net::NetError& e) {
    throw DataPlaneError(where + ": " + e.what());
  }
  im.port = net::local_port(im.listener.get());
  im.advertise = im.options.advertise;
  if (im.advertise.empty()) {
    im.advertise = bind_host;
    if (bind_host == "0.0.0.0" || bind_host == "::") {  // every interface: peers need a name
      char host[256] = {0};
      if (::gethostname(host, sizeof host - 1) == 0) im.advertise = host;
    }
  }
  im.acceptor = std::thread([&im] { im.accept_loop(); });
}

DataPlane::~DataPlane() {
  auto& im = *impl_;
  im.stopping = true;
  im.waker->wake();
  if (im.acceptor.joinable()) im.acceptor.join();
  std::unique_lock lock(im.mutex);
  im.idle.wait(lock, [&] { return im.active == 0; });
}

ObjectRef DataPlane::put(std::vector<char> bytes, bool expires, const std::string& token) {
  auto& im = *impl_;
  Impl::Object object = im.make_object(token);
  const uint64_t size = bytes.size();
  object.bytes = std::make_shared<std::vector<char>>(std::move(bytes));
  return im.store(std::move(object), size, expires);
}

ObjectRef DataPlane::put(DataProto data, bool expires, const std::string& token) {
  auto& im = *impl_;
  Impl::Object object = im.make_object(token);
  const uint64_t size = dataproto::serialized_size(data);
  object.data = std::make_shared<const DataProto>(std::move(data));
  return im.store(std::move(object), size, expires);
}

bool DataPlane::release(const std::string& id) {
  auto& im = *impl_;
  std::lock_guard lock(im.mutex);
  auto it = im.objects.find(id);
  if (it == im.objects.end()) return false;
  auto bytes = std::move(it->second.bytes);
  im.erase_locked(it);
  if (bytes) im.recycle_locked(bytes);
  ++im.stats.released;
  return true;
}


size_t DataPlane::held() const {
  std::lock_guard lock(impl_->mutex);
  impl_->expire_locked(Clock::now());
  return impl_->objects.size();
}

DataPlaneStats DataPlane::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

const DataPlaneOptions& DataPlane::options() const { return impl_->options; }
int DataPlane::port() const { return impl_->port; }

// ---- client -----------------------------------------------------------------------------------

void DataPlane::require_token(const std::string& token) {
  auto& im = *impl_;
  unsigned char bytes[kTokenBytes];
  if (!token.empty() && !crypto::from_hex(token, bytes, kTokenBytes))
    throw ValueError("data plane token '" + token + "' is not 32 hex digits (data_plane_token)");
  std::lock_guard lock(im.mutex);
  im.check_token = !token.empty();
  if (im.check_token) std::memcpy(im.token, bytes, kTokenBytes);
  im.options.token = token;
}

namespace {
/// The holder's answer to a request: what each refusal means, naming the holder.
void check_status(uint8_t status, const std::string& what) {
  if (status == kStatusOk) return;
  if (status == kStatusUnknown)
    throw DataPlaneError(what + ": unknown object id (never stored, already fetched, released or expired)");
  if (status == kStatusEncodeFailed) throw DataPlaneError(what + ": the holder could not encode the object");
  if (status == kStatusBadToken)
    throw DataPlaneError(what + ": the holder refused the request: wrong data plane token (the object belongs to "
                                "another job, or the controller and the nodes do not share the cluster secret)");
  if (status == kStatusBusy)
    throw DataPlaneError(what + ": the holder refused the request: busy (" +
                         std::to_string(DataPlane::Impl::kMaxConnections) + " transfers in progress)");
  throw DataPlaneError(what + ": bad reply status " + std::to_string(status));
}
}  // namespace

std::vector<char> DataPlane::fetch(const ObjectRef& ref, std::chrono::milliseconds timeout) {
  return fetch(ref, timeout, process_token());
}

std::vector<char> DataPlane::fetch(const ObjectRef& ref, std::chrono::milliseconds timeout, const std::string& token) {
  const std::string what = describe(ref);
  const net::Timeouts limits{.each_wait = timeout};
  std::vector<char> bytes;
  with_retries(what, timeout, [&] {
    Fd fd = request(ref, kOpFetch, timeout, token);
    // Prepare the buffer while the holder encodes and starts sending (page faults overlap).
    if (bytes.size() != ref.size) {
      try {
        bytes = reserve_buffer(static_cast<size_t>(ref.size));
        bytes.resize(static_cast<size_t>(ref.size));
      } catch (const std::exception& e) {
        throw DataPlaneError(what + ": cannot allocate " + std::to_string(ref.size) + " bytes: " + e.what());
      }
    }
    char head[1 + 8];
    net::read_all(fd.get(), head, sizeof head, limits);
    check_status(static_cast<uint8_t>(head[0]), what);
    const uint64_t size = get_u64(head + 1);
    if (size != ref.size)
      throw DataPlaneError(what + ": the holder announces " + std::to_string(size) + " bytes, the handle says " +
                           std::to_string(ref.size));
    try {
      net::read_all(fd.get(), bytes.data(), bytes.size(), limits);
    } catch (const net::NetError& e) {
      throw DataPlaneError(what + ": " + e.what());  // answered: never repeated
    }
    return 0;
  });
  client_fetches.fetch_add(1);
  client_fetched_bytes.fetch_add(bytes.size(), std::memory_order_relaxed);
  return bytes;
}

uint64_t DataPlane::fetches() { return client_fetches.load(); }
uint64_t DataPlane::fetched_bytes() { return client_fetched_bytes.load(std::memory_order_relaxed); }

bool DataPlane::discard(const ObjectRef& ref, std::chrono::milliseconds timeout) noexcept {
  try {
    return discard(ref, timeout, process_token());
  } catch (...) {
    return false;
  }
}

bool DataPlane::discard(const ObjectRef& ref, std::chrono::milliseconds timeout, const std::string& token) noexcept {
  try {
    return with_retries(describe(ref), timeout, [&] {
      Fd fd = request(ref, kOpDiscard, timeout, token);
      char status = 0;
      net::read_all(fd.get(), &status, 1, {.each_wait = timeout});
      return static_cast<uint8_t>(status) == kStatusOk;
    });
  } catch (...) {
    return false;
  }
}

// ---- process-wide plane -----------------------------------------------------------------------

namespace {
struct ProcessPlane {
  std::mutex mutex;
  std::optional<DataPlaneOptions> options;
  std::unique_ptr<DataPlane> plane;
  std::atomic<bool> enabled{true};
  std::atomic<size_t> threshold{size_t{1} << 20};
};
ProcessPlane& process_plane() {
  // Never destroyed: CAF threads may still use it while static destructors run.
  static auto* p = new ProcessPlane;
  return *p;
}
const DataPlaneOptions& resolved_locked(ProcessPlane& p) {
  if (!p.options) p.options = DataPlaneOptions::from_environment();
  return *p.options;
}
}  // namespace

DataPlane& DataPlane::process() {
  auto& p = process_plane();
  std::lock_guard lock(p.mutex);
  if (!p.plane) {
    auto o = resolved_locked(p);
    p.enabled = o.enabled;
    p.threshold = o.threshold_bytes;
    p.plane = std::make_unique<DataPlane>(o);
  }
  return *p.plane;
}

std::optional<DataPlaneStats> DataPlane::process_stats() {
  auto& p = process_plane();
  std::lock_guard lock(p.mutex);
  if (!p.plane) return std::nullopt;
  return p.plane->stats();
}

void DataPlane::configure(DataPlaneOptions options) {
  auto& p = process_plane();
  std::lock_guard lock(p.mutex);
  p.enabled = options.enabled;
  p.threshold = options.threshold_bytes;
  if (options.token.empty() && p.options) options.token = p.options->token;  // set_process_token's stays
  if (p.plane) {
    if (!options.token.empty()) p.plane->require_token(options.token);
    p.options->token = options.token;
    p.options->enabled = options.enabled;
    p.options->threshold_bytes = options.threshold_bytes;
    p.options->with_tls = options.with_tls;
  } else {
    p.options = std::move(options);
  }
}

void DataPlane::set_process_token(const std::string& token) {
  auto& p = process_plane();
  std::lock_guard lock(p.mutex);
  if (p.plane) p.plane->require_token(token);  // checks the format
  else if (unsigned char b[kTokenBytes]; !token.empty() && !crypto::from_hex(token, b, kTokenBytes))
    throw ValueError("data plane token '" + token + "' is not 32 hex digits (data_plane_token)");
  resolved_locked(p);
  p.options->token = token;
}

std::string DataPlane::process_token() {
  auto& p = process_plane();
  std::lock_guard lock(p.mutex);
  return p.options ? p.options->token : std::string();
}

std::string data_plane_token(const std::string& secret) {
  if (secret.empty()) return {};
  const crypto::Bytes32 digest = crypto::hmac_sha256(secret, "hyflow-data-plane");
  return crypto::to_hex(digest.data(), kTokenBytes);
}

std::string job_data_plane_token(const std::string& cluster_token, const std::string& job_id) {
  if (job_id.empty()) throw ValueError("job_data_plane_token: the job id is empty");
  if (job_id.size() > 128)
    throw ValueError("job_data_plane_token: the job id has " + std::to_string(job_id.size()) +
                     " characters (at most 128)");
  if (cluster_token.empty()) return {};
  unsigned char key[kTokenBytes];
  if (!crypto::from_hex(cluster_token, key, kTokenBytes))
    throw ValueError("data plane token '" + cluster_token + "' is not 32 hex digits (data_plane_token)");
  const crypto::Bytes32 digest =
      crypto::hmac_sha256(std::string_view(reinterpret_cast<const char*>(key), kTokenBytes), "hyflow-job/" + job_id);
  return crypto::to_hex(digest.data(), kTokenBytes);
}

std::string new_job_id() { return random_id(); }

DataPlaneOptions DataPlane::process_options() {
  auto& p = process_plane();
  std::lock_guard lock(p.mutex);
  return resolved_locked(p);
}

// ---- Value helpers ----------------------------------------------------------------------------

namespace {
/// Where exported objects go, and what qualifies.
struct ExportPolicy {
  std::function<DataPlane&()> plane;  ///< called only when an object reaches the threshold
  bool enabled = true;
  size_t threshold = 0;
  bool expires = true;
  std::string token;  ///< the objects' job token (empty: the plane's own)
};

ExportPolicy policy_of(DataPlane& plane, bool expires, const std::string& token) {
  auto& p = process_plane();
  std::lock_guard lock(p.mutex);
  if (p.plane.get() == &plane)
    return {[&plane]() -> DataPlane& { return plane; }, p.enabled, p.threshold, expires, token};
  return {[&plane]() -> DataPlane& { return plane; }, plane.options().enabled, plane.options().threshold_bytes,
          expires, token};
}

ExportPolicy process_policy(bool expires, const std::string& token) {
  auto& p = process_plane();
  {
    std::lock_guard lock(p.mutex);
    if (!p.plane) {
      const auto& o = resolved_locked(p);
      p.enabled = o.enabled;
      p.threshold = o.threshold_bytes;
    }
  }
  return {[]() -> DataPlane& { return DataPlane::process(); }, p.enabled, p.threshold, expires, token};
}

void export_one(Value& v, const ExportPolicy& policy, std::vector<ObjectRef>& out) {
  if (v.is_list()) {
    for (auto& item : v.list()) export_one(item, policy, out);
    return;
  }
  if (!v.is_dataproto()) return;
  if (dataproto::serialized_size(v.dataproto()) < policy.threshold) return;
  ObjectRef ref = policy.plane().put(std::move(v.dataproto()), policy.expires, policy.token);
  out.push_back(ref);
  v = Value(ref.to_json());
}

template <class T>
std::vector<ObjectRef> export_with(T& values, const ExportPolicy& policy) {
  std::vector<ObjectRef> out;
  if (!policy.enabled) return out;
  try {
    if constexpr (std::is_same_v<T, Value>) {
      export_one(values, policy, out);
    } else {
      for (auto& v : values) export_one(v, policy, out);
    }
  } catch (...) {
    if (!out.empty()) {
      auto& plane = policy.plane();
      for (const auto& r : out) plane.release(r.id);
    }
    throw;
  }
  return out;
}

void collect_refs(const Value& v, std::vector<ObjectRef>& out) {
  if (v.is_list()) {
    for (const auto& item : v.list()) collect_refs(item, out);
  } else if (is_object_ref(v)) {
    out.push_back(ObjectRef::from_json(v.json()));
  }
}

/// Fetches every handle; after a failure the remaining ones are discarded at their holders.
void import_one(Value& v, std::chrono::milliseconds timeout, const std::string& token, std::exception_ptr& failure) {
  if (v.is_list()) {
    for (auto& item : v.list()) import_one(item, timeout, token, failure);
    return;
  }
  if (!is_object_ref(v)) return;
  ObjectRef ref = ObjectRef::from_json(v.json());
  if (failure) {
    DataPlane::discard(ref, timeout, token);
    return;
  }
  try {
    v = Value(dataproto::deserialize_owned(DataPlane::fetch(ref, timeout, token)));
  } catch (...) {
    failure = std::current_exception();
  }
}
}  // namespace

bool data_plane_in_use(bool caf_uses_tls) {  // on every remote call: no copy of the options
  auto& p = process_plane();
  std::lock_guard lock(p.mutex);
  const auto& o = resolved_locked(p);
  return o.enabled && (!caf_uses_tls || o.with_tls);
}

bool is_object_ref(const Value& v) {
  if (!v.is_json()) return false;
  const Json& j = v.json();
  return j.is_object() && j.size() == 1 && j.contains(kRefKey);
}

std::vector<ObjectRef> export_large(std::vector<Value>& values, DataPlane& plane, bool expires,
                                    const std::string& token) {
  return export_with(values, policy_of(plane, expires, token));
}
std::vector<ObjectRef> export_large(Value& value, DataPlane& plane, bool expires, const std::string& token) {
  return export_with(value, policy_of(plane, expires, token));
}
std::vector<ObjectRef> export_large(std::vector<Value>& values, bool expires, const std::string& token) {
  return export_with(values, process_policy(expires, token));
}
std::vector<ObjectRef> export_large(Value& value, bool expires, const std::string& token) {
  return export_with(value, process_policy(expires, token));
}

std::vector<ObjectRef> object_refs_in(const Value& value) {
  std::vector<ObjectRef> out;
  collect_refs(value, out);
  return out;
}

void import_refs(std::vector<Value>& values, std::chrono::milliseconds timeout) {
  import_refs(values, timeout, DataPlane::process_token());
}

void import_refs(Value& value, std::chrono::milliseconds timeout) {
  import_refs(value, timeout, DataPlane::process_token());
}

void import_refs(std::vector<Value>& values, std::chrono::milliseconds timeout, const std::string& token) {
  std::exception_ptr failure;
  for (auto& v : values) import_one(v, timeout, token, failure);
  if (failure) std::rethrow_exception(failure);
}

void import_refs(Value& value, std::chrono::milliseconds timeout, const std::string& token) {
  std::exception_ptr failure;
  import_one(value, timeout, token, failure);
  if (failure) std::rethrow_exception(failure);
}

}  // namespace hyflow::cluster
