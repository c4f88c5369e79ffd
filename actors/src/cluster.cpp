// The cluster on CAF's network layer: the node manager that caf-node publishes, and the
// controller's RemoteLauncher. Protocol (untyped node manager actor):
//
//   ("hf_hello", version, session actor) -> json {nonce, session, node}   (version checked)
//   ("hf_auth", session, hmac hex)       -> "ok"                           (HMAC-SHA256(secret, nonce))
//   ("hf_spawn", session, worker name)   -> actor (an uninitialized worker, detached)
//   ("hf_port", session)                 -> free TCP port on the node (MASTER_PORT)
//
// Errors come back in the "hfnode" category with the text as context. The node monitors each
// controller's session actor and each worker: a controller that goes away takes its workers
// with it; a worker death is logged.
#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/actors/cluster.hpp>
#include <hyflow/actors/colocated.hpp>
#include <hyflow/actors/data_plane.hpp>

#include "cluster_gpu.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include <torch/cuda.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace hyflow {

using hello_atom = caf::atom_constant<caf::atom("hf_hello")>;
using auth_atom = caf::atom_constant<caf::atom("hf_auth")>;
using spawn_atom = caf::atom_constant<caf::atom("hf_spawn")>;
using port_atom = caf::atom_constant<caf::atom("hf_port")>;

namespace {

caf::error node_error(std::string text) { return caf::error(1, caf::atom("hfnode"), caf::make_message(std::move(text))); }

std::string error_text(caf::actor_system& sys, const caf::error& e) {
  if (e.category() == caf::atom("hfnode") || e.category() == caf::atom("hyflow")) {
    const auto& ctx = e.context();
    std::string out;
    for (size_t i = 0; i < ctx.size(); ++i)
      if (ctx.match_element<std::string>(i)) out += (out.empty() ? "" : ": ") + ctx.get_as<std::string>(i);
    if (!out.empty()) return out;
  }
  return sys.render(e);
}

std::string to_hex(const unsigned char* p, size_t n) {
  std::ostringstream os;
  for (size_t i = 0; i < n; ++i) os << std::hex << std::setw(2) << std::setfill('0') << int(p[i]);
  return os.str();
}

std::string random_nonce() {
  unsigned char buf[32];
  if (RAND_bytes(buf, sizeof buf) != 1) throw ClusterError("cannot draw a random challenge (RAND_bytes failed)");
  return to_hex(buf, sizeof buf);
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

int free_port(const std::string& bind) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (::inet_pton(AF_INET, bind == "localhost" ? "127.0.0.1" : bind.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = INADDR_ANY;
  int port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::pair<std::string, int> split_address(const std::string& addr) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())
    throw ValueError("cluster node '" + addr + "' is not host:port");
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(addr.substr(colon + 1), &used);
    if (used != addr.size() - colon - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw ValueError("cluster node '" + addr + "': port '" + addr.substr(colon + 1) + "' is not a number");
  }
  if (port <= 0 || port > 65535) throw ValueError("cluster node '" + addr + "': port out of range");
  return {addr.substr(0, colon), port};
}

NodeInfo local_node_info() {
  NodeInfo info;
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) == 0) info.hostname = host;
  info.cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#ifdef HYFLOW_CLUSTER_CUDA
  detail::fill_cuda_devices(info);  // count, names, memory (cluster_gpu_cuda.cpp)
#else
  // Without HYFLOW_CUDA the CUDA runtime is not linked: LibTorch's count, no names or memory.
  info.gpus = static_cast<int>(torch::cuda::device_count());
#endif
  info.protocol_version = kNodeProtocolVersion;
  return info;
}

// ---- shutdown ordering (a CAF 0.17.6 race) -------------------------------------------------
//
// CAF's BASP broker monitors every local actor that a remote node holds a proxy of: on the
// controller, the collector of each group with remote workers (it sends the calls); on a node,
// each worker. When such an actor terminates it first unregisters from the system (so that
// ~actor_system's await_all_actors_done() can return) and only afterwards sends its down
// message to the broker. If ~actor_system stops the middleman in between, the broker never
// handles that message; the queued message keeps a strong reference to the actor, and a
// detached actor (the collector, the workers) that is never destroyed makes ~actor_system
// wait for its thread forever (await_detached_threads). Seen as an intermittent hang of the
// controller at exit (about 1 run in 6 of the gloo test) and a risk for caf-node on SIGTERM.
//
// The cure is an order, not a retry: before the middleman stops, wait until every local actor
// that is ending has run its attachables, then let the broker handle everything queued so
// far. "Ran its attachables" is observable: the broker put the actor into the registry when
// it first forwarded one of its messages, and the registry's erase hook was attached before
// the broker's monitor (attachables run newest first), so once the registry entry of an
// ending actor is gone, its down message is in the broker's mailbox. One request the broker
// answers (FIFO behind that message) then flushes it.

/// A local actor still in the registry that is ending: terminated, or (not hidden) already
/// unregistered. Cleanup unregisters first (that is what lets the running count reach 0), then
/// marks the actor terminated and runs its attachables, the broker's monitor among them, and
/// the registry's erase hook after it; so while this holds, a down message may still be on its
/// way to the broker. Callers only ask once the running count says no other actor runs.
bool ending_actor_in_registry(caf::actor_system& sys) {
  using caf::abstract_actor;
  const auto last = sys.latest_actor_id();
  for (caf::actor_id id = 1; id <= last; ++id) {
    auto p = sys.registry().get<caf::strong_actor_ptr>(id);
    if (!p || p->node() != sys.node()) continue;
    const auto* a = p->get();
    if (a->getf(abstract_actor::is_terminated_flag) ||
        (!a->getf(abstract_actor::is_hidden_flag) && !a->getf(abstract_actor::is_registered_flag)))
      return true;
  }
  return false;
}

caf::actor basp_broker_of(caf::actor_system& sys) {
  return sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
}

/// Blocking form (NodeServer teardown, after await_all_actors_done): waits up to `budget` for
/// ending actors to run their attachables, then flushes the broker's mailbox.
void drain_basp(caf::actor_system& sys, std::chrono::milliseconds budget) {
  const auto end = std::chrono::steady_clock::now() + budget;
  while (ending_actor_in_registry(sys) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto left = std::max(std::chrono::milliseconds(100), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                 end - std::chrono::steady_clock::now()));
  caf::scoped_actor self{sys, /*hide=*/true};
  self->request(basp_broker_of(sys), caf::timespan{left}, caf::get_atom::value, sys.node())
      .receive([](caf::node_id&, std::string&, uint16_t) {}, [](caf::error&) {});
}

using guard_gone_atom = caf::atom_constant<caf::atom("hf_gone")>;
using guard_tick_atom = caf::atom_constant<caf::atom("hf_gtick")>;

/// Live shutdown guards per actor system (one per RemoteLauncher). Never destroyed: a guard
/// of a Runtime that is never torn down (leaked by its owner) still ticks while static
/// destructors run at exit.
struct GuardCounts {
  std::mutex mutex;
  std::map<const caf::actor_system*, size_t> live;
};
GuardCounts& guard_counts() {
  static auto* counts = new GuardCounts;
  return *counts;
}

size_t guards_of(const caf::actor_system& sys) {
  auto& g = guard_counts();
  std::lock_guard lock(g.mutex);
  auto it = g.live.find(&sys);
  return it == g.live.end() ? 0 : it->second;
}

struct guard_state {
  // Not an aggregate: CAF 0.17 constructs a state from the actor pointer when it can, and
  // C++20's parenthesized aggregate initialization would turn that pointer into `gone`.
  guard_state() = default;
  bool gone = false;
  int drain_ticks = 0;
  /// Once its launcher is gone nothing else refers to the guard, and CAF destroys an actor
  /// nobody refers to (exit reason "unreachable"), pending messages or not: it holds itself.
  caf::strong_actor_ptr keep_alive;
  static inline const char* name = "hyflow.cluster_shutdown_guard";
};

/// The controller side of the cure: a non-hidden actor, so ~actor_system's
/// await_all_actors_done() waits for it. Once its launcher is gone and no other actor runs
/// (the groups' collectors have terminated), it waits for their attachables, flushes the
/// broker and quits; only then does the actor system go on to stop the middleman. While
/// other actors run (a launcher dropped mid-run) it just idles.
caf::behavior shutdown_guard(caf::stateful_actor<guard_state>* self) {
  {
    auto& g = guard_counts();
    std::lock_guard lock(g.mutex);
    ++g.live[&self->system()];
  }
  auto finish = [self] {
    {
      auto& g = guard_counts();
      std::lock_guard lock(g.mutex);
      if (--g.live[&self->system()] == 0) g.live.erase(&self->system());
    }
    self->quit();
    self->state.keep_alive = nullptr;
  };
  return {
      [self](guard_gone_atom) {
        if (self->state.gone) return;
        self->state.gone = true;
        self->state.keep_alive = caf::actor_cast<caf::strong_actor_ptr>(self);
        self->send(self, guard_tick_atom::value);
      },
      [self, finish](guard_tick_atom) {
        auto& sys = self->system();
        if (sys.registry().running() > guards_of(sys)) {  // groups (or a launcher dropped mid-run) still running
          self->delayed_send(self, std::chrono::milliseconds(10), guard_tick_atom::value);
          return;
        }
        if (ending_actor_in_registry(sys) && ++self->state.drain_ticks < 400) {  // at most ~2 s
          self->delayed_send(self, std::chrono::milliseconds(5), guard_tick_atom::value);
          return;
        }
        self->request(basp_broker_of(sys), std::chrono::seconds(2), caf::get_atom::value, sys.node())
            .then([finish](caf::node_id&, std::string&, uint16_t) { finish(); },
                  [finish](caf::error&) { finish(); });
      },
  };
}

// ---- node manager --------------------------------------------------------------------------

struct Session {
  caf::actor controller;
  std::string nonce;
  bool authenticated = false;
  std::vector<caf::actor> workers;
};

struct node_state {
  std::string secret;
  std::string bind;
  NodeInfo info;
  std::map<uint64_t, Session> sessions;
  std::map<caf::actor_addr, std::string> worker_names;
  uint64_t next_session = 1;
  static inline const char* name = "hyflow.node_manager";
};

using node_actor = caf::stateful_actor<node_state>;

void stop_session_workers(node_actor* self, Session& s, const caf::error& reason) {
  for (auto& w : s.workers) self->send_exit(w, reason);
  s.workers.clear();
}

caf::behavior node_manager(node_actor* self, std::string secret, std::string bind, NodeInfo info) {
  self->state.secret = std::move(secret);
  self->state.bind = std::move(bind);
  self->state.info = std::move(info);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    for (auto it = st.sessions.begin(); it != st.sessions.end(); ++it) {
      if (it->second.controller.address() != dm.source) continue;
      cluster_log("session " + std::to_string(it->first) + ": controller gone (" + self->system().render(dm.reason) +
                  "); stopping its " + std::to_string(it->second.workers.size()) + " worker(s)");
      stop_session_workers(self, it->second, caf::exit_reason::user_shutdown);
      st.sessions.erase(it);
      return;
    }
    auto w = st.worker_names.find(dm.source);
    if (w != st.worker_names.end()) {
      cluster_log("worker '" + w->second + "' ended: " + self->system().render(dm.reason));
      for (auto& [id, s] : st.sessions)
        s.workers.erase(std::remove_if(s.workers.begin(), s.workers.end(),
                                       [&](const caf::actor& a) { return a.address() == dm.source; }),
                        s.workers.end());
      st.worker_names.erase(w);
    }
  });
  self->set_exit_handler([=](caf::exit_msg& em) {
    for (auto& [id, s] : self->state.sessions) stop_session_workers(self, s, caf::exit_reason::user_shutdown);
    self->state.sessions.clear();
    self->quit(em.reason);
  });
  auto session_of = [=](uint64_t id, const char* what) -> Session* {
    auto it = self->state.sessions.find(id);
    if (it == self->state.sessions.end() || !it->second.authenticated) {
      cluster_log(std::string("refused ") + what + " for unauthenticated session " + std::to_string(id));
      return nullptr;
    }
    return &it->second;
  };
  return {
      [=](hello_atom, uint32_t version, caf::actor controller) -> caf::result<std::string> {
        auto& st = self->state;
        if (version != kNodeProtocolVersion) {
          cluster_log("refused a controller speaking protocol v" + std::to_string(version));
          return node_error("protocol version mismatch: node speaks v" + std::to_string(kNodeProtocolVersion) +
                            ", controller v" + std::to_string(version));
        }
        if (!controller) return node_error("hello without a session actor");
        const uint64_t id = st.next_session++;
        Session s;
        s.controller = controller;
        s.authenticated = st.secret.empty();
        if (!s.authenticated) s.nonce = random_nonce();
        self->monitor(controller);
        Json reply{{"nonce", s.nonce}, {"session", id}, {"node", st.info.to_json()}};
        st.sessions.emplace(id, std::move(s));
        cluster_log("session " + std::to_string(id) + ": hello from a controller" +
                    (st.secret.empty() ? " (no secret configured: accepted)" : ", challenge sent"));
        return reply.dump();
      },
      [=](auth_atom, uint64_t id, const std::string& proof) -> caf::result<std::string> {
        auto& st = self->state;
        auto it = st.sessions.find(id);
        if (it == st.sessions.end()) return node_error("unknown session " + std::to_string(id));
        if (it->second.authenticated) return std::string("ok");
        if (!constant_time_equal(proof, challenge_proof(st.secret, it->second.nonce))) {
          cluster_log("session " + std::to_string(id) + ": wrong shared secret, refused");
          self->demonitor(it->second.controller);
          st.sessions.erase(it);
          return node_error("authentication failed: the controller's shared secret does not match this node's");
        }
        it->second.authenticated = true;
        cluster_log("session " + std::to_string(id) + ": authenticated");
        return std::string("ok");
      },
      [=](spawn_atom, uint64_t id, const std::string& name) -> caf::result<caf::actor> {
        Session* s = session_of(id, "spawn");
        if (!s) return node_error("not authenticated: this node requires the shared secret (--secret-file)");
        auto w = caf::actor_cast<caf::actor>(caf_protocol::spawn_worker(self->system()));
        self->monitor(w);
        s->workers.push_back(w);
        self->state.worker_names[w.address()] = name;
        cluster_log("session " + std::to_string(id) + ": spawned worker '" + name + "'");
        return w;
      },
      [=](port_atom, uint64_t id) -> caf::result<int32_t> {
        if (!session_of(id, "port")) return node_error("not authenticated");
        int p = free_port(self->state.bind);
        if (p == 0) return node_error("no free port on " + self->state.bind);
        return static_cast<int32_t>(p);
      },
  };
}

struct NodeConfig : caf::actor_system_config {
  explicit NodeConfig(const NodeOptions& o) {
    caf_protocol::register_types(*this);
    // BASP decodes incoming messages on the I/O thread instead of handing each one to a worker
    // job on the (polling) scheduler: ~150 us less per remote call (bench/cluster); large
    // DataProtos use the data plane. Not on controllers: there ~actor_system then hung now and
    // then (docs/cluster.md, "Data plane"); they use the sharing scheduler instead.
    set("middleman.workers", size_t{0});
    load<caf::io::middleman>();
    if (!o.tls_cert.empty()) {  // checked by check_tls_files; the middleman must come first
      load<caf::openssl::manager>();
      openssl_certificate = o.tls_cert;
      openssl_key = o.tls_key;
      openssl_cafile = o.tls_ca;
    }
    if (o.scheduler_threads > 0) set("scheduler.max-threads", static_cast<size_t>(o.scheduler_threads));
    if (o.heartbeat_interval_ms > 0)
      set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(o.heartbeat_interval_ms)});
    if (o.connection_timeout_ms > 0)
      set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(o.connection_timeout_ms)});
  }
};

}  // namespace

// ---- shared helpers ----------------------------------------------------------------------

Json NodeInfo::to_json() const {
  return Json{{"address", address},   {"hostname", hostname},   {"cpus", cpus},
              {"gpus", gpus},         {"gpu_names", gpu_names}, {"gpu_memory_bytes", gpu_memory_bytes},
              {"protocol_version", protocol_version}};
}

NodeInfo NodeInfo::from_json(const Json& j) {
  NodeInfo n;
  n.address = j.value("address", "");
  n.hostname = j.value("hostname", "");
  n.cpus = j.value("cpus", 0);
  n.gpus = j.value("gpus", 0);
  n.gpu_names = j.value("gpu_names", std::vector<std::string>{});
  n.gpu_memory_bytes = j.value("gpu_memory_bytes", std::vector<int64_t>{});
  n.protocol_version = j.value("protocol_version", 0u);
  return n;
}

std::vector<std::string> parse_node_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    split_address(item);  // validates
    out.push_back(item);
  }
  if (out.empty()) throw ValueError("cluster.nodes: no node in '" + list + "'");
  return out;
}

std::string read_secret_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError("secret file '" + path + "' cannot be read");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) throw ValueError("secret file '" + path + "' is empty");
  return s;
}

std::string challenge_proof(const std::string& secret, const std::string& challenge) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(challenge.data()), challenge.size(), md, &len))
    throw ClusterError("HMAC-SHA256 failed");
  return to_hex(md, len);
}

namespace {

std::string openssl_reason() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM data";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

std::unique_ptr<FILE, FileCloser> open_pem(const std::string& path, const std::string& what) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw ValueError("TLS " + what + " file '" + path + "' cannot be read: " + std::strerror(errno));
  return f;
}

std::unique_ptr<X509, decltype(&X509_free)> read_certificate(const std::string& path, const std::string& what) {
  auto f = open_pem(path, what);
  ERR_clear_error();
  std::unique_ptr<X509, decltype(&X509_free)> cert(PEM_read_X509(f.get(), nullptr, nullptr, nullptr), &X509_free);
  if (!cert) throw ValueError("TLS " + what + " file '" + path + "' holds no PEM certificate (" + openssl_reason() + ")");
  return cert;
}

}  // namespace

bool check_tls_files(const std::string& cert, const std::string& key, const std::string& ca,
                     const std::vector<std::string>& names) {
  const std::string* files[3] = {&cert, &key, &ca};
  std::string missing, given;
  for (size_t i = 0; i < 3; ++i) {
    const std::string name = i < names.size() ? names[i] : "TLS file " + std::to_string(i + 1);
    std::string& list = files[i]->empty() ? missing : given;
    list += (list.empty() ? "" : ", ") + name;
  }
  if (given.empty()) return false;
  if (!missing.empty())
    throw ValueError("mutual TLS needs a certificate, its key and a CA file together: " + given + " given, " + missing +
                     " missing");
  auto certificate = read_certificate(cert, "certificate");
  read_certificate(ca, "CA");
  auto f = open_pem(key, "key");
  ERR_clear_error();
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(PEM_read_PrivateKey(f.get(), nullptr, nullptr, nullptr),
                                                          &EVP_PKEY_free);
  if (!pkey)
    throw ValueError("TLS key file '" + key + "' holds no unencrypted PEM private key (" + openssl_reason() + ")");
  if (X509_check_private_key(certificate.get(), pkey.get()) != 1) {
    ERR_clear_error();
    throw ValueError("TLS key file '" + key + "' does not belong to the certificate '" + cert + "'");
  }
  return true;
}

void cluster_log(const std::string& text) {
  static std::mutex m;
  const auto now = std::chrono::system_clock::now();
  const auto t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::ostringstream os;
  os << std::put_time(&tm, "%Y-%m-%dT%H:%M:%S") << '.' << std::setw(3) << std::setfill('0') << ms << "Z [caf-node] "
     << text << '\n';
  std::lock_guard lock(m);
  std::cerr << os.str() << std::flush;
}

// ---- NodeServer ----------------------------------------------------------------------------

struct NodeServer::Impl {
  explicit Impl(const NodeOptions& o) : config(o), system(config) {}
  NodeConfig config;
  caf::actor_system system;
  caf::actor manager;
  NodeInfo info;
  int port = 0;
};

namespace {
std::unique_ptr<NodeServer::Impl> make_node_impl(const NodeOptions& o) {
  check_tls_files(o.tls_cert, o.tls_key, o.tls_ca, {"--tls-cert", "--tls-key", "--tls-ca"});  // before CAF sees them
  return std::make_unique<NodeServer::Impl>(o);
}
}  // namespace

NodeServer::NodeServer(NodeOptions options) : impl_(make_node_impl(options)) {
  register_colocated_worker_type();  // WorkerDict bundles of the registered roles
  DataPlaneOptions plane;  // the data plane listens where the node does, unless told otherwise
  plane.bind = options.bind;
  DataPlane::configure(DataPlaneOptions::from_environment(plane));
  impl_->info = local_node_info();
  impl_->manager = impl_->system.spawn(node_manager, options.secret, options.bind, impl_->info);
  const auto port_arg = static_cast<uint16_t>(options.port);
  auto port = options.tls_cert.empty()
                  ? impl_->system.middleman().publish(impl_->manager, port_arg, options.bind.c_str(), true)
                  : caf::openssl::publish(impl_->manager, port_arg, options.bind.c_str(), true);
  if (!port) {
    caf::anon_send_exit(impl_->manager, caf::exit_reason::user_shutdown);
    throw ClusterError("cannot listen on " + options.bind + ":" + std::to_string(options.port) + ": " +
                       impl_->system.render(port.error()));
  }
  impl_->port = *port;
  impl_->info.address = options.bind + ":" + std::to_string(*port);
}

NodeServer::~NodeServer() {
  if (impl_->manager) caf::anon_send_exit(impl_->manager, caf::exit_reason::user_shutdown);
  impl_->manager = nullptr;
  // The manager stops every worker; a running method finishes first. Then the broker must
  // handle the workers' down messages before ~actor_system stops the middleman (see
  // "shutdown ordering" above).
  impl_->system.await_all_actors_done();
  drain_basp(impl_->system, std::chrono::seconds(2));
}

int NodeServer::port() const { return impl_->port; }
const NodeInfo& NodeServer::info() const { return impl_->info; }

// ---- RemoteLauncher ------------------------------------------------------------------------

struct RemoteLauncher::Impl {
  struct Node {
    NodeInfo info;
    std::string host;
    int port = 0;
    caf::actor manager;
    uint64_t session = 0;
  };
  Impl(caf::actor_system& s, ClusterOptions o) : sys(s), options(std::move(o)) {}
  caf::actor_system& sys;
  ClusterOptions options;
  bool tls = false;
  caf::actor session_actor;  ///< the nodes monitor it: when it goes, they stop our workers
  caf::actor shutdown_guard;  ///< orders the actor system's shutdown (see "shutdown ordering")
  std::vector<Node> nodes;
  std::vector<NodeInfo> infos;

  Node connect_node(const std::string& addr) {
    auto [host, port] = split_address(addr);
    Node n;
    n.host = host;
    n.port = port;
    caf::scoped_actor self{sys};
    const auto timeout = caf::timespan{options.connect_timeout};
    std::string failure;
    // remote_actor() can hang on a silent peer: ask the middleman with a deadline instead.
    auto mm = tls ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
    self->request(mm, timeout, caf::connect_atom::value, host, static_cast<uint16_t>(port))
        .receive(
            [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>&) {
              if (!ptr) failure = "no node manager is published there";
              else n.manager = caf::actor_cast<caf::actor>(std::move(ptr));
            },
            [&](caf::error& e) {
              failure = e == caf::sec::request_timeout
                            ? "no answer within " + std::to_string(options.connect_timeout.count()) + " ms"
                            : sys.render(e);
              if (e == caf::sec::request_timeout || e == caf::sec::disconnect_during_handshake)
                failure += tls ? " (over TLS: does the node use TLS, and does each side trust the other's CA?)"
                               : " (if the node uses TLS, set cluster.tls_cert, cluster.tls_key and cluster.tls_ca)";
            });
    if (!failure.empty()) throw ClusterError("cannot connect to node " + addr + ": " + failure);
    Json hello;
    self->request(n.manager, timeout, hello_atom::value, kNodeProtocolVersion, session_actor)
        .receive([&](std::string& j) { hello = Json::parse(j); },
                 [&](caf::error& e) { failure = error_text(sys, e); });
    if (!failure.empty()) throw ClusterError("node " + addr + " refused the controller: " + failure);
    n.session = hello.at("session").get<uint64_t>();
    n.info = NodeInfo::from_json(hello.at("node"));
    if (n.info.protocol_version != kNodeProtocolVersion)
      throw ClusterError("node " + addr + " speaks protocol v" + std::to_string(n.info.protocol_version) +
                         ", this controller v" + std::to_string(kNodeProtocolVersion));
    n.info.address = addr;
    const std::string nonce = hello.value("nonce", "");
    if (!nonce.empty()) {
      if (options.secret.empty())
        throw ClusterError("node " + addr + " requires a shared secret and the controller has none (cluster secret file)");
      self->request(n.manager, timeout, auth_atom::value, n.session, challenge_proof(options.secret, nonce))
          .receive([](std::string&) {}, [&](caf::error& e) { failure = error_text(sys, e); });
      if (!failure.empty()) throw ClusterError("node " + addr + ": " + failure);
    }
    return n;
  }
};

std::shared_ptr<RemoteLauncher> RemoteLauncher::connect(Runtime& runtime, ClusterOptions options) {
  auto& sys = caf_protocol::system_of(runtime);
  if (!sys.has_middleman())
    throw ValueError("RemoteLauncher: the Runtime has no networking; create it with RuntimeOptions{.network = true}");
  if (options.nodes.empty()) throw ValueError("RemoteLauncher: cluster.nodes is empty");
  auto addrs = options.nodes;
  for (const auto& a : addrs) split_address(a);
  std::sort(addrs.begin(), addrs.end(), [](const std::string& a, const std::string& b) {
    auto x = split_address(a), y = split_address(b);
    return x < y;
  });
  if (std::adjacent_find(addrs.begin(), addrs.end()) != addrs.end())
    throw ValueError("cluster.nodes lists a node twice: " + *std::adjacent_find(addrs.begin(), addrs.end()));
  const bool tls = check_tls_files(options.tls_cert, options.tls_key, options.tls_ca,
                                   {"cluster.tls_cert", "cluster.tls_key", "cluster.tls_ca"});
  if (tls) {
    // CAF's TLS sessions read the files from the actor system's configuration and need the
    // openssl module, loaded when the system was built: the Runtime must carry the same files.
    if (!sys.has_openssl_manager())
      throw ValueError("cluster TLS (cluster.tls_cert/tls_key/tls_ca) needs a Runtime created with CAF's openssl module "
                       "and the same three files (RuntimeOptions tls_cert, tls_key, tls_ca); this Runtime has no TLS");
    const auto& cfg = sys.config();
    if (cfg.openssl_certificate != options.tls_cert || cfg.openssl_key != options.tls_key ||
        cfg.openssl_cafile != options.tls_ca)
      throw ValueError("cluster TLS files differ from the Runtime's (certificate '" + cfg.openssl_certificate +
                       "', key '" + cfg.openssl_key + "', CA '" + cfg.openssl_cafile + "'); give both the same files");
  }
  auto impl = std::make_unique<Impl>(sys, std::move(options));
  impl->tls = tls;
  impl->session_actor = sys.spawn<caf::hidden>([]() -> caf::behavior { return {[](int32_t) {}}; });
  impl->shutdown_guard = sys.spawn(shutdown_guard);
  try {
    for (const auto& a : addrs) {
      impl->nodes.push_back(impl->connect_node(a));
      impl->infos.push_back(impl->nodes.back().info);
    }
  } catch (...) {
    caf::anon_send_exit(impl->session_actor, caf::exit_reason::user_shutdown);
    caf::anon_send(impl->shutdown_guard, guard_gone_atom::value);
    throw;
  }
  return std::shared_ptr<RemoteLauncher>(new RemoteLauncher(std::move(impl)));
}

RemoteLauncher::RemoteLauncher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemoteLauncher::~RemoteLauncher() {
  caf::anon_send_exit(impl_->session_actor, caf::exit_reason::user_shutdown);
  caf::anon_send(impl_->shutdown_guard, guard_gone_atom::value);
}

const std::vector<NodeInfo>& RemoteLauncher::nodes() const { return impl_->infos; }

ResourcePool RemoteLauncher::pool(int workers_per_node, bool use_gpu) const {
  return pool(std::vector<int>(impl_->nodes.size(), workers_per_node), use_gpu);
}

ResourcePool RemoteLauncher::pool(std::vector<int> process_on_nodes, bool use_gpu) const {
  if (process_on_nodes.size() > impl_->nodes.size())
    throw ClusterError("resource shortfall: the pool needs " + std::to_string(process_on_nodes.size()) +
                       " nodes, the cluster has " + std::to_string(impl_->nodes.size()));
  int max_gpus = 0;
  for (size_t i = 0; i < process_on_nodes.size(); ++i) {
    const auto& n = impl_->infos[i];
    if (use_gpu && process_on_nodes[i] > n.gpus)
      throw ClusterError("resource shortfall on node " + n.address + ": " + std::to_string(process_on_nodes[i]) +
                         " GPU workers requested, " + std::to_string(n.gpus) + " GPU(s) advertised");
    max_gpus = std::max(max_gpus, n.gpus);
  }
  return ResourcePool(std::move(process_on_nodes), 10, use_gpu ? max_gpus : 8, use_gpu);
}

std::vector<WorkerRef> RemoteLauncher::launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) {
  auto& im = *impl_;
  auto& sys = im.sys;
  if (envs.empty()) return {};
  std::vector<size_t> node_of;
  for (const auto& e : envs) {
    auto us = e.name.rfind('_'), colon = e.name.rfind(':');
    size_t idx = 0;
    try {
      if (us == std::string::npos || colon == std::string::npos || colon < us) throw std::invalid_argument("name");
      idx = std::stoul(e.name.substr(us + 1, colon - us - 1));
    } catch (const std::exception&) {
      throw ValueError("RemoteLauncher: worker name '" + e.name + "' does not say its node (\"..._{node}:{local}\")");
    }
    if (idx >= im.nodes.size())
      throw ClusterError("resource shortfall: rank " + std::to_string(e.rank) + " ('" + e.name + "') needs node " +
                         std::to_string(idx) + ", the cluster has " + std::to_string(im.nodes.size()) + " node(s)");
    node_of.push_back(idx);
  }
  caf::scoped_actor self{sys};
  std::vector<caf::actor> spawned;
  auto fail = [&](const std::string& what) {
    for (auto& a : spawned) self->send_exit(a, caf::exit_reason::user_shutdown);
    throw ClusterError(what);
  };
  // MASTER_ADDR/PORT on the rank-0 node.
  auto& master = im.nodes[node_of[0]];
  int master_port = 0;
  std::string failure;
  self->request(master.manager, caf::timespan{im.options.spawn_timeout}, port_atom::value, master.session)
      .receive([&](int32_t p) { master_port = p; }, [&](caf::error& e) { failure = error_text(sys, e); });
  if (!failure.empty()) fail("node " + master.info.address + ": cannot reserve MASTER_PORT: " + failure);

  std::vector<WorkerEnv> placed = envs;
  for (size_t i = 0; i < placed.size(); ++i) {
    placed[i].master_addr = master.host;
    placed[i].master_port = master_port;
    placed[i].name += "@" + im.nodes[node_of[i]].info.address;
  }
  using spawn_handle = decltype(self->request(master.manager, caf::infinite, spawn_atom::value, uint64_t{0}, std::string{}));
  std::vector<spawn_handle> spawns;
  for (size_t i = 0; i < placed.size(); ++i) {
    auto& n = im.nodes[node_of[i]];
    spawns.push_back(self->request(n.manager, caf::timespan{im.options.spawn_timeout}, spawn_atom::value, n.session,
                                   placed[i].name));
  }
  for (size_t i = 0; i < spawns.size(); ++i)
    spawns[i].receive([&](caf::actor& a) { spawned.push_back(std::move(a)); },
                      [&](caf::error& e) {
                        if (failure.empty())
                          failure = "node " + im.nodes[node_of[i]].info.address + ": spawning rank " + std::to_string(i) +
                                    " failed: " + error_text(sys, e);
                      });
  if (!failure.empty()) fail(failure);
  const std::string spec_json = spec.to_json().dump();
  std::vector<caf_protocol::worker_actor> workers;
  for (auto& a : spawned) workers.push_back(caf::actor_cast<caf_protocol::worker_actor>(a));
  using init_handle =
      decltype(self->request(workers[0], caf::infinite, caf_protocol::init_atom::value, spec_json, spec_json));
  std::vector<init_handle> inits;
  for (size_t i = 0; i < workers.size(); ++i)
    inits.push_back(self->request(workers[i], caf::timespan{im.options.init_timeout}, caf_protocol::init_atom::value,
                                  spec_json, placed[i].to_json().dump()));
  int failed_rank = -1;
  for (size_t i = 0; i < inits.size(); ++i)
    inits[i].receive([](std::string&) {},
                     [&](caf::error& e) {
                       if (failure.empty()) failed_rank = static_cast<int>(i);
                       if (failed_rank == static_cast<int>(i))
                         failure = "constructing worker type '" + spec.type + "' failed on rank " + std::to_string(i) +
                                   " of " + std::to_string(workers.size()) + " (node " +
                                   im.nodes[node_of[i]].info.address + "): " + error_text(sys, e);
                     });
  if (!failure.empty()) {
    for (auto& a : spawned) self->send_exit(a, caf::exit_reason::user_shutdown);
    throw CallError("__init__", failed_rank, failure, failure);
  }
  std::vector<WorkerRef> out;
  for (size_t i = 0; i < workers.size(); ++i) out.push_back(caf_protocol::make_worker_ref(workers[i], spec, placed[i]));
  return out;
}

}  // namespace hyflow
