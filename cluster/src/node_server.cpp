// The node manager that caf-node publishes, and NodeServer around it. Errors go back to the
// controller in the "hfnode" category with the text as context. The node monitors each
// controller's session actor and each worker: a controller that goes away takes its workers
// with it; a worker death is logged.
#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/actors/colocated.hpp>
#include <hyflow/cluster/auth.hpp>
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/cluster/node_server.hpp>

#include "crypto.hpp"
#include "detail.hpp"
#include "front_door.hpp"
#include "net.hpp"
#include "tls_scribe.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>

#include <algorithm>
#include <atomic>
#include <future>
#include <map>

namespace hyflow::cluster {
namespace {

// ---- node manager --------------------------------------------------------------------------

// Every peer that can send the manager a message has passed the front door (the shared secret),
// so a session is authenticated from its hello on.
struct Session {
  caf::actor controller;
  std::vector<caf::actor> workers;
};

struct node_state {
  std::string bind;
  NodeInfo info;
  std::map<uint64_t, Session> sessions;
  std::map<caf::actor_addr, std::string> worker_names;
  static inline const char* name = "hyflow.node_manager";
};

using node_actor = caf::stateful_actor<node_state>;

void stop_session_workers(node_actor* self, Session& s, const caf::error& reason) {
  for (auto& w : s.workers) self->send_exit(w, reason);
  s.workers.clear();
}

caf::behavior node_manager(node_actor* self, std::string bind, NodeInfo info) {
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
    // The workers end with the node's reason (NodeServer::shutdown), which their controllers
    // report: "caf-node ... received SIGTERM", not CAF's generic user_shutdown.
    for (auto& [id, s] : self->state.sessions) stop_session_workers(self, s, em.reason);
    self->state.sessions.clear();
    self->quit(em.reason);
  });
  auto session_of = [=](uint64_t id, const char* what) -> Session* {
    auto it = self->state.sessions.find(id);
    if (it == self->state.sessions.end()) {
      cluster_log(std::string("refused ") + what + " for unknown session " + std::to_string(id));
      return nullptr;
    }
    return &it->second;
  };
  return {
      [=](detail::hello_atom, uint32_t version, caf::actor controller) -> caf::result<std::string> {
        auto& st = self->state;
        if (version != kNodeProtocolVersion) {
          cluster_log("refused a controller speaking protocol v" + std::to_string(version));
          return detail::node_error("protocol version mismatch: node speaks v" + std::to_string(kNodeProtocolVersion) +
                                    ", controller v" + std::to_string(version));
        }
        if (!controller) return detail::node_error("hello without a session actor");
        uint64_t id = 0;  // unguessable, so that one controller cannot use another's session
        try {
          while (id == 0 || st.sessions.count(id)) crypto::random_bytes(&id, sizeof id, "a session id");
        } catch (const ClusterError& e) {
          return detail::node_error(e.what());
        }
        Session s;
        s.controller = controller;
        self->monitor(controller);
        st.sessions.emplace(id, std::move(s));
        cluster_log("session " + std::to_string(id) + ": hello from a controller");
        return Json{{"session", id}, {"node", st.info.to_json()}}.dump();
      },
      [=](detail::spawn_atom, uint64_t id, const std::string& name) -> caf::result<caf::actor> {
        Session* s = session_of(id, "spawn");
        if (!s) return detail::node_error("unknown session " + std::to_string(id) + " (say hf_hello first)");
        auto w = caf::actor_cast<caf::actor>(actors::caf_protocol::spawn_worker(self->system()));
        self->monitor(w);
        s->workers.push_back(w);
        self->state.worker_names[w.address()] = name;
        cluster_log("session " + std::to_string(id) + ": spawned worker '" + name + "'");
        return w;
      },
      [=](detail::port_atom, uint64_t id) -> caf::result<int32_t> {
        if (!session_of(id, "port")) return detail::node_error("unknown session " + std::to_string(id));
        int p = net::free_port(self->state.bind);
        if (p == 0) return detail::node_error("no free port on " + self->state.bind);
        return static_cast<int32_t>(p);
      },
  };
}

struct NodeConfig : caf::actor_system_config {
  explicit NodeConfig(const NodeOptions& o) {
    actors::caf_protocol::register_types(*this);
    // BASP decodes incoming messages on the I/O thread instead of handing each one to a worker
    // job on the (polling) scheduler: ~150 us less per remote call (bench/cluster); large
    // DataProtos use the data plane. Not on controllers: there ~actor_system then hung now and
    // then (docs/cluster.md, "Data plane"); they use the sharing scheduler instead.
    set("middleman.workers", size_t{0});
    load<caf::io::middleman>();
    if (!o.tls.empty()) detail::configure_tls(*this, o.tls);  // checked before; after the middleman
    if (o.scheduler_threads > 0) set("scheduler.max-threads", static_cast<size_t>(o.scheduler_threads));
    if (o.heartbeat_interval_ms > 0)
      set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(o.heartbeat_interval_ms)});
    if (o.connection_timeout_ms > 0)
      set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(o.connection_timeout_ms)});
  }
};

}  // namespace

// ---- NodeServer ----------------------------------------------------------------------------

struct NodeServer::Impl {
  explicit Impl(const NodeOptions& o) : config(o), system(config) {}
  NodeConfig config;
  caf::actor_system system;
  caf::actor manager;
  NodeInfo info;
  int port = 0;
  /// Owns the listening socket; CAF only gets connections that passed it.
  std::unique_ptr<detail::FrontDoor> front_door;
};

namespace {
std::unique_ptr<NodeServer::Impl> make_node_impl(const NodeOptions& o) {
  check_tls_files(o.tls, {"--tls-cert", "--tls-key", "--tls-ca"});  // before CAF sees them
  return std::make_unique<NodeServer::Impl>(o);
}

/// Hands an authenticated connection to CAF's BASP broker as a server-side connection: the broker
/// adopts it, registers the node manager as the actor published under `key` and sends its
/// server handshake, exactly as for a connection its own doorman would have accepted.
void admit_to_basp(caf::actor_system& sys, const caf::actor& manager, uint16_t key, caf::io::scribe_ptr scribe) {
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  caf::anon_send(broker, caf::publish_atom::value, std::move(scribe), key,
                 caf::actor_cast<caf::strong_actor_ptr>(manager), std::set<std::string>{});
}
}  // namespace

NodeServer::NodeServer(NodeOptions options) : impl_(make_node_impl(options)) {
  if (options.max_message_bytes == 0) throw ValueError("NodeOptions::max_message_bytes must be positive");
  actors::register_colocated_worker_type();  // WorkerDict bundles of the registered roles
  install_data_plane();              // large DataProtos of the hosted workers' results
  DataPlaneOptions plane;            // the data plane listens where the node does, unless told otherwise
  plane.bind = options.bind;
  plane.token = data_plane_token(options.secret);  // only peers that know the secret fetch from it
  DataPlane::configure(DataPlaneOptions::from_environment(plane));
  impl_->info = detail::local_node_info();
  const bool tls = !options.tls.empty();
  impl_->manager = impl_->system.spawn(node_manager, options.bind, impl_->info);
  // The front door owns the listening socket: a peer proves the secret before its connection
  // becomes a CAF connection (over TLS when the node has certificates).
  auto key = std::make_shared<std::atomic<uint16_t>>(0);
  auto admit = [sys = &impl_->system, manager = impl_->manager, key, tls, max = options.max_message_bytes](int fd) {
    try {
      admit_to_basp(*sys, manager, *key, detail::make_basp_scribe(*sys, fd, /*accepted=*/true, tls, max));
    } catch (const std::exception& e) {
      cluster_log(std::string("front door: cannot hand a connection to CAF: ") + e.what());
    }
  };
  try {
    impl_->front_door = std::make_unique<detail::FrontDoor>(
        detail::FrontDoorOptions{.bind = options.bind, .port = options.port, .secret = options.secret, .tls = tls},
        std::move(admit));
  } catch (...) {
    caf::anon_send_exit(impl_->manager, caf::exit_reason::user_shutdown);
    throw;
  }
  impl_->port = impl_->front_door->port();
  *key = static_cast<uint16_t>(impl_->port);
  impl_->info.address = options.bind + ":" + std::to_string(impl_->port);
}

void NodeServer::shutdown(const std::string& why) {
  impl_->front_door.reset();  // no new connections
  if (!impl_->manager) return;
  // In the "hyflow" category as a worker's own exit, so that controllers show `why`.
  caf::error reason(static_cast<uint8_t>(actors::caf_protocol::errc::worker_exit), caf::atom("hyflow"),
                    caf::make_message(std::string("exit"), "node " + impl_->info.address + ": " + why));
  caf::anon_send(impl_->manager, caf::exit_msg{caf::actor_addr{}, std::move(reason)});
  impl_->manager = nullptr;
}

NodeServer::~NodeServer() {
  shutdown("the node was shut down");
  // The manager stops every worker; a running method finishes first. Then the broker must
  // handle the workers' down messages before ~actor_system stops the middleman (see
  // "shutdown ordering" above).
  impl_->system.await_all_actors_done();
  detail::drain_basp(impl_->system, std::chrono::seconds(2));
}

int NodeServer::port() const {
  return impl_->port;
}
const NodeInfo& NodeServer::info() const {
  return impl_->info;
}

uint64_t NodeServer::wrong_secret_count() const {
  return impl_->front_door ? impl_->front_door->stats().wrong_secret : 0;
}

std::vector<PeerLiveness> NodeServer::peer_liveness(std::chrono::milliseconds timeout) const {
  auto& mm = impl_->system.middleman();
  caf::actor handle = mm.named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  if (!handle) return {};
  auto answer = std::make_shared<std::promise<std::vector<PeerLiveness>>>();
  auto future = answer->get_future();
  // The broker runs on the multiplexer's thread, so a function posted there reads its
  // connection table between two of its messages. `handle` keeps the broker alive meanwhile;
  // an answer that comes after the timeout goes into the promise nobody waits for.
  mm.backend().post([handle, answer] {
    auto* broker = static_cast<caf::io::basp_broker*>(caf::actor_cast<caf::abstract_actor*>(handle));
    std::vector<PeerLiveness> peers;
    const auto now = broker->system().clock().now();
    for (auto& [hdl, ctx] : broker->ctx) {
      const std::string host = broker->remote_addr(hdl);
      if (host.empty()) continue;  // closing
      peers.push_back({host + ":" + std::to_string(broker->remote_port(hdl)),
                       std::chrono::duration<double>(now - ctx.last_seen).count()});
    }
    answer->set_value(std::move(peers));
  });
  if (future.wait_for(timeout) != std::future_status::ready) return {};
  return future.get();
}

}  // namespace hyflow::cluster
