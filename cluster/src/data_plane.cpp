// The data plane's TCP server and client (see data_plane.hpp for the protocol). Plain POSIX
// sockets: every wait goes through poll() with the io_timeout, so no operation can hang.
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/dataproto/serialization.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
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

using Clock = std::chrono::steady_clock;
constexpr char kMagic[4] = {'H', 'F', 'O', 'B'};
constexpr uint8_t kOpFetch = 1, kOpDiscard = 2;
constexpr uint8_t kStatusOk = 0, kStatusUnknown = 1, kStatusEncodeFailed = 2, kStatusBadToken = 3, kStatusBusy = 4;
constexpr size_t kIdBytes = 16;
constexpr size_t kTokenBytes = 16;
constexpr size_t kRequestBytes = 4 + 1 + kIdBytes + kTokenBytes;
constexpr const char* kRefKey = "$hyflow_object";

std::string errno_text(int e) { return std::strerror(e); }

/// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Waits until `fd` is ready for `events`; false on timeout. Throws on poll errors.
bool wait_for(int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{fd, events, 0};
  for (;;) {
    int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw DataPlaneError("poll failed: " + errno_text(errno));
  }
}

/// Sends all of [data, data + n); `what` names the peer and object for errors.
void send_all(int fd, const char* data, size_t n, std::chrono::milliseconds timeout, const std::string& what) {
  size_t done = 0;
  while (done < n) {
    ssize_t k = ::send(fd, data + done, n - done, MSG_NOSIGNAL);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLOUT, timeout))
        throw DataPlaneError(what + ": send timed out after " + std::to_string(timeout.count()) + " ms (" +
                             std::to_string(done) + " of " + std::to_string(n) + " bytes sent)");
      continue;
    }
    throw DataPlaneError(what + ": send failed after " + std::to_string(done) + " of " + std::to_string(n) +
                         " bytes: " + errno_text(errno));
  }
}

/// Receives exactly n bytes; a peer that closes early is a "short read".
void recv_all(int fd, char* data, size_t n, std::chrono::milliseconds timeout, const std::string& what) {
  size_t done = 0;
  while (done < n) {
    ssize_t k = ::recv(fd, data + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0)
      throw DataPlaneError(what + ": short read: the peer closed the connection after " + std::to_string(done) +
                           " of " + std::to_string(n) + " bytes");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, timeout))
        throw DataPlaneError(what + ": receive timed out after " + std::to_string(timeout.count()) + " ms (" +
                             std::to_string(done) + " of " + std::to_string(n) + " bytes received)");
      continue;
    }
    throw DataPlaneError(what + ": receive failed after " + std::to_string(done) + " of " + std::to_string(n) +
                         " bytes: " + errno_text(errno));
  }
}

std::string to_hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

/// 16 id bytes from 32 hex digits; false when `hex` is not that.
bool from_hex(const std::string& hex, unsigned char* out) {
  if (hex.size() != 2 * kIdBytes) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < kIdBytes; ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

std::string random_id() {
  unsigned char buf[kIdBytes];
  size_t got = 0;
  while (got < sizeof buf) {
    ssize_t k = ::getrandom(buf + got, sizeof buf - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw DataPlaneError("cannot draw a random object id: " + errno_text(errno));
    got += static_cast<size_t>(k);
  }
  return to_hex(buf, sizeof buf);
}

void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

/// Connects to host:port within `timeout` (non-blocking connect + poll).
Fd connect_to(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    throw DataPlaneError(what + ": cannot resolve host '" + host + "': " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
  std::string last = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      last = errno_text(errno);
      continue;
    }
    set_nonblocking(fd.get());
    set_nodelay(fd.get());
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last = errno_text(errno);
      continue;
    }
    if (rc != 0) {
      if (!wait_for(fd.get(), POLLOUT, timeout)) {
        last = "connect timed out after " + std::to_string(timeout.count()) + " ms";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = errno_text(err);
        continue;
      }
    }
    return fd;
  }
  throw DataPlaneError(what + ": cannot connect: " + last);
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

std::string describe(const ObjectRef& ref) { return "data plane object " + ref.id + " at " + ref.address(); }

/// The token's bytes (zeros for an empty token); false when it is not 32 hex digits.
bool token_bytes(const std::string& token, unsigned char* out) {
  if (token.empty()) {
    std::memset(out, 0, kTokenBytes);
    return true;
  }
  return from_hex(token, out);
}

/// Sends one request; returns the connected socket for the reply.
Fd request(const ObjectRef& ref, uint8_t op, std::chrono::milliseconds timeout, const std::string& token) {
  const std::string what = describe(ref);
  unsigned char id[kIdBytes], tok[kTokenBytes];
  if (!from_hex(ref.id, id)) throw DataPlaneError(what + ": the id is not 32 hex digits");
  if (!token_bytes(token, tok)) throw DataPlaneError(what + ": the data plane token is not 32 hex digits");
  Fd fd = connect_to(ref.host, ref.port, timeout, what);
  char req[kRequestBytes];
  std::memcpy(req, kMagic, 4);
  req[4] = static_cast<char>(op);
  std::memcpy(req + 5, id, kIdBytes);
  std::memcpy(req + 5 + kIdBytes, tok, kTokenBytes);
  send_all(fd.get(), req, sizeof req, timeout, what);
  return fd;
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
  int wake[2] = {-1, -1};  ///< a pipe: writing to it stops the accept loop
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
      if (CRYPTO_memcmp(j.token.data(), t, kTokenBytes) == 0) found = &j;
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
    if (o.job) return CRYPTO_memcmp(o.token.data(), t, kTokenBytes) == 0;
    return !check_token || CRYPTO_memcmp(token, t, kTokenBytes) == 0;
  }
  /// An object to store, with `job_token` (hex; empty: the server's own token) as its key.
  Object make_object(const std::string& job_token) {
    Object o;
    if (job_token.empty()) return o;
    if (!from_hex(job_token, o.token.data()))
      throw ValueError("data plane job token '" + job_token + "' is not 32 hex digits (job_data_plane_token)");
    o.job = true;
    return o;
  }
  void store_locked(const std::string& id, Object o) {
    if (o.job) hold_job_token_locked(o.token);
    objects[id] = std::move(o);
    ++stats.put;
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
    [[maybe_unused]] auto n = ::send(fd.get(), head, sizeof head, MSG_NOSIGNAL);
  }

  /// The request of `p` is complete: check it and hand it to a serving thread.
  void dispatch(Pending& p) {
    const uint8_t op = static_cast<uint8_t>(p.req[4]);
    if (std::memcmp(p.req, kMagic, 4) != 0 || (op != kOpFetch && op != kOpDiscard)) return;  // not ours: hang up
    std::unique_lock lock(mutex);
    const auto* request_token = reinterpret_cast<const unsigned char*>(p.req + 5 + kIdBytes);
    if (check_token && CRYPTO_memcmp(request_token, token, kTokenBytes) != 0 &&
        !find_job_token_locked(request_token)) {
      ++stats.refused;
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
    try {
      std::thread([this, fd = p.fd.release(), req]() mutable {
        serve(Fd(fd), req);
        std::lock_guard lock(mutex);
        if (--active == 0) idle.notify_all();
      }).detach();
    } catch (const std::system_error&) {  // no thread to be had: refuse this one
      std::lock_guard relock(mutex);
      if (--active == 0) idle.notify_all();
    }
  }

  /// Reads what `p` sent; true when it is finished with (dispatched or closed).
  bool progress(Pending& p) {
    for (;;) {
      ssize_t k = ::recv(p.fd.get(), p.req + p.got, kRequestBytes - p.got, 0);
      if (k > 0) {
        p.got += static_cast<size_t>(k);
        if (p.got == kRequestBytes) {
          dispatch(p);
          return true;
        }
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      return !(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));  // closed or failed: drop
    }
  }

  void accept_loop() {
    std::vector<pollfd> fds;
    while (!stopping) {
      fds.clear();
      fds.push_back({listener.get(), POLLIN, 0});
      fds.push_back({wake[0], POLLIN, 0});
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
        int c = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        set_nodelay(c);
        if (pending.size() >= kMaxPending) {  // a flood: the oldest idle connection makes room
          pending.erase(pending.begin());
          std::lock_guard lock(mutex);
          ++stats.timed_out;
        }
        Pending p;
        p.fd = Fd(c);
        p.deadline = Clock::now() + options.request_timeout;
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
    const auto timeout = options.io_timeout;
    try {
      const uint8_t op = static_cast<uint8_t>(req[4]);
      const std::string id = to_hex(reinterpret_cast<const unsigned char*>(req.data() + 5), kIdBytes);
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
        send_all(fd.get(), head, op == kOpDiscard ? 1 : sizeof head, timeout, "data plane server");
        return;
      }
      if (op == kOpDiscard) {
        const char status = static_cast<char>(object ? kStatusOk : kStatusUnknown);
        if (object) give_back(object->bytes);
        send_all(fd.get(), &status, 1, timeout, "data plane server");
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
          send_all(fd.get(), head, sizeof head, timeout, "data plane server");
          return;
        }
      }
      if (object) {
        head[0] = static_cast<char>(kStatusOk);
        put_u64(head + 1, object->size);
      }
      send_all(fd.get(), head, sizeof head, timeout, "data plane server");
      if (object) send_all(fd.get(), object->bytes->data(), object->bytes->size(), timeout, "data plane server");
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
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(im.options.port));
  const std::string bind_host = im.options.bind == "localhost" ? "127.0.0.1" : im.options.bind;
  if (::inet_pton(AF_INET, bind_host.c_str(), &addr.sin_addr) != 1)
    throw DataPlaneError(where + ": '" + im.options.bind + "' is not an IPv4 address");
  im.listener = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (im.listener.get() < 0) throw DataPlaneError(where + ": socket failed: " + errno_text(errno));
  int one = 1;
  ::setsockopt(im.listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(im.listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw DataPlaneError(where + ": cannot bind: " + errno_text(errno));
  if (::listen(im.listener.get(), 512) != 0) throw DataPlaneError(where + ": cannot listen: " + errno_text(errno));
  socklen_t len = sizeof addr;
  ::getsockname(im.listener.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  im.port = ntohs(addr.sin_port);
  im.advertise = im.options.advertise;
  if (im.advertise.empty()) {
    im.advertise = bind_host;
    if (bind_host == "0.0.0.0") {
      char host[256] = {0};
      if (::gethostname(host, sizeof host - 1) == 0) im.advertise = host;
    }
  }
  if (::pipe2(im.wake, O_CLOEXEC) != 0) throw DataPlaneError(where + ": pipe failed: " + errno_text(errno));
  im.acceptor = std::thread([&im] { im.accept_loop(); });
}

DataPlane::~DataPlane() {
  auto& im = *impl_;
  im.stopping = true;
  if (im.wake[1] >= 0) (void)!::write(im.wake[1], "x", 1);
  if (im.acceptor.joinable()) im.acceptor.join();
  std::unique_lock lock(im.mutex);
  im.idle.wait(lock, [&] { return im.active == 0; });
  lock.unlock();
  for (int fd : im.wake)
    if (fd >= 0) ::close(fd);
}

ObjectRef DataPlane::put(std::vector<char> bytes, bool expires, const std::string& token) {
  auto& im = *impl_;
  Impl::Object object = im.make_object(token);
  ObjectRef ref;
  ref.host = im.advertise;
  ref.port = im.port;
  ref.id = random_id();
  ref.size = bytes.size();
  object.bytes = std::make_shared<std::vector<char>>(std::move(bytes));
  object.size = ref.size;
  object.expires = expires ? Clock::now() + im.options.object_ttl : Clock::time_point::max();
  std::lock_guard lock(im.mutex);
  im.store_locked(ref.id, std::move(object));
  return ref;
}

ObjectRef DataPlane::put(DataProto data, bool expires, const std::string& token) {
  auto& im = *impl_;
  Impl::Object object = im.make_object(token);
  ObjectRef ref;
  ref.host = im.advertise;
  ref.port = im.port;
  ref.id = random_id();
  ref.size = dataproto::serialized_size(data);
  object.data = std::make_shared<const DataProto>(std::move(data));
  object.size = ref.size;
  object.expires = expires ? Clock::now() + im.options.object_ttl : Clock::time_point::max();
  std::lock_guard lock(im.mutex);
  im.store_locked(ref.id, std::move(object));
  return ref;
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
  if (!token.empty() && !from_hex(token, bytes))
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
  Fd fd = request(ref, kOpFetch, timeout, token);
  // Prepare the buffer while the holder encodes and starts sending (page faults overlap).
  std::vector<char> bytes;
  try {
    bytes = reserve_buffer(static_cast<size_t>(ref.size));
    bytes.resize(static_cast<size_t>(ref.size));
  } catch (const std::exception& e) {
    throw DataPlaneError(what + ": cannot allocate " + std::to_string(ref.size) + " bytes: " + e.what());
  }
  char head[1 + 8];
  recv_all(fd.get(), head, sizeof head, timeout, what);
  check_status(static_cast<uint8_t>(head[0]), what);
  const uint64_t size = get_u64(head + 1);
  if (size != ref.size)
    throw DataPlaneError(what + ": the holder announces " + std::to_string(size) + " bytes, the handle says " +
                         std::to_string(ref.size));
  recv_all(fd.get(), bytes.data(), bytes.size(), timeout, what);
  client_fetches.fetch_add(1);
  return bytes;
}

uint64_t DataPlane::fetches() { return client_fetches.load(); }

bool DataPlane::discard(const ObjectRef& ref, std::chrono::milliseconds timeout) noexcept {
  try {
    return discard(ref, timeout, process_token());
  } catch (...) {
    return false;
  }
}

bool DataPlane::discard(const ObjectRef& ref, std::chrono::milliseconds timeout, const std::string& token) noexcept {
  try {
    Fd fd = request(ref, kOpDiscard, timeout, token);
    char status = 0;
    recv_all(fd.get(), &status, 1, timeout, describe(ref));
    return static_cast<uint8_t>(status) == kStatusOk;
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
  else if (unsigned char b[kTokenBytes]; !token.empty() && !from_hex(token, b))
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
  static const char label[] = "hyflow-data-plane";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(label),
            sizeof label - 1, md, &len))
    throw DataPlaneError("HMAC-SHA256 failed while deriving the data plane token");
  return to_hex(md, kTokenBytes);
}

std::string job_data_plane_token(const std::string& cluster_token, const std::string& job_id) {
  if (job_id.empty()) throw ValueError("job_data_plane_token: the job id is empty");
  if (job_id.size() > 128)
    throw ValueError("job_data_plane_token: the job id has " + std::to_string(job_id.size()) +
                     " characters (at most 128)");
  if (cluster_token.empty()) return {};
  unsigned char key[kTokenBytes];
  if (!from_hex(cluster_token, key))
    throw ValueError("data plane token '" + cluster_token + "' is not 32 hex digits (data_plane_token)");
  const std::string message = "hyflow-job/" + job_id;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key, static_cast<int>(kTokenBytes), reinterpret_cast<const unsigned char*>(message.data()),
            message.size(), md, &len))
    throw DataPlaneError("HMAC-SHA256 failed while deriving a job's data plane token");
  return to_hex(md, kTokenBytes);
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
