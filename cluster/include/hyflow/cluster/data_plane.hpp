#pragma once
// The data plane: large DataProtos travel between processes over a plain TCP connection of
// their own, beside the CAF control messages (as Ray's object store does beside its RPCs).
//
// Every process that sends a large DataProto to another process holds its encoded bytes (the
// DataProto wire format) in its DataPlane, a small TCP server, and the CAF message carries only
// a handle: the holder's host and port, a random 128-bit object id and the size. The receiver
// pulls the bytes and decodes them with deserialize_owned (no copy). An object is freed once
// fetched, when its call settles (answered, failed, timed out), or after object_ttl.
//
// Protocol (one request per connection, little-endian):
//   client -> "HFOB" | op (1 = fetch, 2 = discard) | 16-byte id | 16-byte token
//   fetch:   server -> status | u64 size | size bytes
//   discard: server -> status
//   status: 0 ok, 1 unknown id, 2 encoding failed, 3 wrong token, 4 busy (refusals send a zero size)
// Tokens: the cluster's, data_plane_token(secret), and one per job (a controller session),
// job_data_plane_token(cluster token, job id). An object stored for a job is served only to a
// request carrying that job's token (a wrong token neither receives nor frees it); one stored
// without a job needs the cluster token. A server with a token refuses, before any thread
// serves it, a request whose token is neither the cluster's nor that of a job it has recently
// stored objects for. An accepted connection costs the server no thread until its whole request (37 bytes) has
// arrived; one that has not sent it within request_timeout is closed. When 256 such
// connections wait (churn), every request that has arrived is served first, then the oldest
// eighth of the unfinished ones is closed to make room: a complete request is never evicted.
// Every socket operation has a timeout (io_timeout); failures are DataPlaneError naming the
// holder's address and the object id. A request whose connection the holder closed or reset
// before answering (no byte of the reply) is sent again after 10 ms, doubling up to 160 ms,
// within the request's timeout and at most 32 times.
//
// The WorkerGroup API does not change: install_data_plane() makes the data plane the runtime's
// PayloadTransfer (hyflow/actors/payload_transfer.hpp), which swaps DataProtos for handles
// (export_large) and back (import_refs) when a call or its result crosses processes.

#include <hyflow/actors/value.hpp>
#include <hyflow/core/error.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::cluster {

/// Moving an object over the data plane failed: connection refused, timeout, short read,
/// unknown or already fetched id. what() names the holder ("host:port") and the object id.
class DataPlaneError : public Error {
 public:
  using Error::Error;
};

struct DataPlaneOptions {
  /// Listen address of this process's data server, a host name or an IPv4 or IPv6 address
  /// (127.0.0.1: this machine only).
  std::string bind = "127.0.0.1";
  /// Host that peers use to reach this server; empty: `bind`, or the host name when `bind`
  /// is 0.0.0.0 or ::.
  std::string advertise;
  /// TCP port (0: a free one).
  int port = 0;
  /// DataProtos whose encoding is at least this many bytes travel over the data plane;
  /// smaller ones stay inline in the CAF message.
  size_t threshold_bytes = size_t{1} << 20;
  /// Limit on every single socket operation (connect, each wait to send or receive).
  std::chrono::milliseconds io_timeout{10000};
  /// An accepted connection must deliver its whole request within this (idle peers are closed).
  std::chrono::milliseconds request_timeout{2000};
  /// Token every request must carry (32 hex digits, data_plane_token() of the cluster secret);
  /// empty: not checked. NodeServer and RemoteLauncher::connect set the process-wide one.
  std::string token;
  /// Objects put with `expires` that nobody fetched or released are dropped after this long
  /// (results a worker holds for a controller that went away).
  std::chrono::milliseconds object_ttl{600000};
  /// Off: every DataProto stays inline in the CAF messages.
  bool enabled = true;
  /// Also use the data plane when this process's CAF connections use TLS (its actor system
  /// has an openssl certificate). The data plane is plain TCP, so by default a TLS cluster
  /// keeps every DataProto inside its encrypted CAF messages.
  bool with_tls = false;

  /// `defaults` overridden by the environment: HYFLOW_DATA_PLANE=off, HYFLOW_DATA_PLANE_BIND,
  /// HYFLOW_DATA_PLANE_HOST (advertise), HYFLOW_DATA_PLANE_THRESHOLD (bytes),
  /// HYFLOW_DATA_PLANE_TIMEOUT_MS, HYFLOW_DATA_PLANE_TTL_MS, HYFLOW_DATA_PLANE_WITH_TLS=1. A
  /// malformed value is a ValueError naming the variable.
  static DataPlaneOptions from_environment(DataPlaneOptions defaults);
  /// The same over the built-in defaults.
  static DataPlaneOptions from_environment();
};

/// A handle to an object held by some process's DataPlane.
struct ObjectRef {
  std::string host;
  int port = 0;
  std::string id;  ///< 32 hex digits (128 random bits): unguessable, so it doubles as the token
  uint64_t size = 0;

  std::string address() const { return host + ":" + std::to_string(port); }
  Json to_json() const;
  /// FormatError naming the field when `j` is not a handle.
  static ObjectRef from_json(const Json& j);
};

/// Counters of one DataPlane (what it was given and what became of it).
struct DataPlaneStats {
  uint64_t put = 0;       ///< objects stored
  uint64_t fetched = 0;   ///< objects served (and so freed)
  uint64_t released = 0;  ///< freed by release() or a peer's discard before being fetched
  uint64_t expired = 0;   ///< freed after object_ttl
  uint64_t unknown = 0;   ///< requests for ids it does not hold
  uint64_t refused = 0;   ///< requests with a wrong token, or while every serving thread was busy
  uint64_t bad_token = 0; ///< of those refused: a token that does not grant the server or the object
  uint64_t timed_out = 0; ///< connections closed before sending a whole request
  uint64_t bytes_served = 0;
};

/// One TCP server holding encoded objects until they are pulled.
class DataPlane {
 public:
  /// Binds and starts serving; DataPlaneError when the address cannot be bound.
  explicit DataPlane(DataPlaneOptions options = {});
  /// Stops the server (waits for transfers in progress, each bounded by io_timeout) and
  /// frees every object.
  ~DataPlane();
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  /// Stores `bytes` until fetched or released, or (with `expires`) until object_ttl passes;
  /// the handle names this server. `token` (32 hex digits, job_data_plane_token) is the only
  /// one that may fetch or discard the object; empty: this server's own token (the cluster's).
  /// ValueError for a malformed token.
  ObjectRef put(std::vector<char> bytes, bool expires = true, const std::string& token = {});
  /// Stores a DataProto, encoded in the wire format (serialization.hpp) when it is fetched
  /// (into a buffer kept from earlier sends, up to 2 are kept): until then only tensor handles
  /// are held, no copy. The handle's size is the encoding's. `token` as above.
  ObjectRef put(DataProto data, bool expires = true, const std::string& token = {});
  /// Frees an object; false when it was already gone (fetched, released, expired).
  bool release(const std::string& id);
  /// Objects held now.
  size_t held() const;
  DataPlaneStats stats() const;
  const DataPlaneOptions& options() const;
  int port() const;

  /// Pulls the object from its holder (which frees it there). DataPlaneError naming the
  /// holder and the id on a refused connection, a timeout, a short read, a size that differs
  /// from the handle's, or an id the holder does not have.
  /// Sends the process-wide token (set_process_token); a holder that refuses the token or is
  /// busy is named with the reason.
  static std::vector<char> fetch(const ObjectRef& ref, std::chrono::milliseconds io_timeout);
  /// The same with an explicit token (empty: zeros).
  static std::vector<char> fetch(const ObjectRef& ref, std::chrono::milliseconds io_timeout, const std::string& token);
  /// Asks the holder to free the object; true when it held it. Never throws: an unreachable
  /// holder is reported as false (its objects expire anyway).
  static bool discard(const ObjectRef& ref, std::chrono::milliseconds io_timeout) noexcept;
  /// The same with an explicit token (a job's; empty: zeros).
  static bool discard(const ObjectRef& ref, std::chrono::milliseconds io_timeout, const std::string& token) noexcept;
  /// Objects this process has pulled from any holder with fetch() (for diagnostics and tests).
  static uint64_t fetches();
  /// Bytes this process has pulled with fetch() (the payloads, without the 9-byte heads).
  static uint64_t fetched_bytes();

  /// The process-wide plane used by the runtime, started on first use with the options given
  /// to configure(), else DataPlaneOptions::from_environment().
  static DataPlane& process();
  /// The stats of the process-wide plane; nullopt while it has not been started (this call
  /// never starts it).
  static std::optional<DataPlaneStats> process_stats();
  /// Requires `token` (32 hex digits; empty: none) on every later request to this server;
  /// ValueError for a malformed token.
  void require_token(const std::string& token);
  /// The token this process sends with fetch/discard and its own plane requires.
  static void set_process_token(const std::string& token);
  static std::string process_token();
  /// Options of the process-wide plane (the threshold decides what travels over it). Called
  /// after the plane has started, only the threshold, `enabled`, `with_tls` and the token
  /// change; an empty token keeps the one set before.
  static void configure(DataPlaneOptions options);
  /// The options the process-wide plane has or will start with.
  static DataPlaneOptions process_options();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// The data plane token of a cluster: HMAC-SHA256(secret, "hyflow-data-plane") cut to 128 bits,
/// in hex; empty for an empty secret. Every process of the cluster derives the same one.
std::string data_plane_token(const std::string& secret);

/// The data plane token of one job (a controller session) of a cluster: HMAC-SHA256(cluster
/// token, "hyflow-job/" + job id) cut to 128 bits, in hex; empty when `cluster_token` is empty
/// (a cluster without a secret checks nothing). The controller and every node derive it from
/// the job id, which travels in the job's own (authenticated) CAF messages; objects a job's
/// calls move are stored under it, so another job (or a peer that knows only the cluster
/// token) can neither fetch nor free them. ValueError for an empty or overlong job id.
std::string job_data_plane_token(const std::string& cluster_token, const std::string& job_id);

/// A fresh job id: 128 random bits in hex.
std::string new_job_id();

/// Whether this process sends large DataProtos over its data plane: enabled, and either its
/// CAF connections are not TLS (`caf_uses_tls`) or `with_tls` is set.
bool data_plane_in_use(bool caf_uses_tls);

/// True when `v` is a data-plane handle (a JSON object with the reserved key
/// "$hyflow_object"; user JSON must not use that key at the top level).
bool is_object_ref(const Value& v);

/// Replaces every DataProto in `values` (also inside lists) whose encoding reaches the
/// threshold by a handle to it, stored in `plane` (put with `expires` and `token`, see
/// DataPlane::put); returns the handles. Nothing is replaced when the plane is disabled.
std::vector<ObjectRef> export_large(std::vector<Value>& values, DataPlane& plane, bool expires = true,
                                    const std::string& token = {});
std::vector<ObjectRef> export_large(Value& value, DataPlane& plane, bool expires = true,
                                    const std::string& token = {});
/// The same with the process-wide plane, which starts only when a DataProto reaches the
/// threshold (small payloads never start a server).
std::vector<ObjectRef> export_large(std::vector<Value>& values, bool expires = true, const std::string& token = {});
std::vector<ObjectRef> export_large(Value& value, bool expires = true, const std::string& token = {});

/// Handles inside `value` (also inside lists), without fetching anything.
std::vector<ObjectRef> object_refs_in(const Value& value);

/// Replaces every handle in `values` by the DataProto it names, pulled from its holder and
/// decoded without a copy. DataPlaneError (see fetch) or FormatError on bad bytes; objects
/// not reached yet are discarded at their holders so that nothing is left behind.
/// Requests carry the process token (DataPlane::set_process_token).
void import_refs(std::vector<Value>& values, std::chrono::milliseconds io_timeout);
void import_refs(Value& value, std::chrono::milliseconds io_timeout);
/// The same with an explicit token (a job's, job_data_plane_token).
void import_refs(std::vector<Value>& values, std::chrono::milliseconds io_timeout, const std::string& token);
void import_refs(Value& value, std::chrono::milliseconds io_timeout, const std::string& token);

/// Makes the process-wide data plane the runtime's PayloadTransfer, so that remote calls move
/// large DataProtos over it (idempotent). RemoteLauncher::connect and NodeServer call it. A
/// call's objects are stored and fetched under its job's token (job_data_plane_token of the
/// process token and the job id the PayloadTransfer is given), or the process token when the
/// call names no job.
void install_data_plane();

}  // namespace hyflow::cluster
