// The controller's RemoteLauncher: connects to and authenticates with caf-nodes, places
// workers on them and keeps a session per node (see node_server.hpp for the protocol).
#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/actors/error.hpp>
#include <hyflow/cluster/auth.hpp>
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/cluster/remote_launcher.hpp>

#include "detail.hpp"
#include "front_door.hpp"
#include "tls_scribe.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/openssl/all.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

namespace hyflow::cluster {

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
  /// This controller session's job id: its workers' large payloads travel under the job's own
  /// data plane token (job_data_plane_token), not only the cluster's.
  const std::string job = new_job_id();
  /// Nodes whose manager went down (the connection broke or the node stopped): address -> why.
  struct Dead {
    std::mutex mutex;
    std::map<std::string, std::string> nodes;
  };
  std::shared_ptr<Dead> dead = std::make_shared<Dead>();
  /// ClusterError when node `i` is down, naming it and why.
  void check_alive(size_t i) const {
    std::lock_guard lock(dead->mutex);
    auto it = dead->nodes.find(nodes.at(i).info.address);
    if (it != dead->nodes.end())
      throw ClusterError("node " + it->first + " is down (" + it->second + "): no worker can be placed on it");
  }
  caf::actor_system& sys;
  ClusterOptions options;
  bool tls = false;
  caf::actor session_actor;   ///< the nodes monitor it: when it goes, they stop our workers
  caf::actor shutdown_guard;  ///< orders the actor system's shutdown (see "shutdown ordering")
  std::vector<Node> nodes;
  std::vector<NodeInfo> infos;

  Node connect_node(const std::string& addr) {
    auto [host, port] = detail::split_address(addr);
    Node n;
    n.host = host;
    n.port = port;
    caf::scoped_actor self{sys};
    const auto timeout = caf::timespan{options.connect_timeout};
    std::string failure;
    auto on_handshake = [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>&) {
      if (!ptr)
        failure = "no node manager is published there";
      else
        n.manager = caf::actor_cast<caf::actor>(std::move(ptr));
    };
    // Prove the secret at the node's front door first; only then does the connection become a
    // CAF (BASP) connection, over TLS when this controller has certificates, handed to this
    // process's BASP broker.
    const int fd = detail::front_door_connect(host, port, options.secret, tls, options.connect_timeout);
    auto& mm = sys.middleman();
    caf::io::scribe_ptr scribe = detail::make_basp_scribe(sys, fd, /*accepted=*/false, tls, options.max_message_bytes);
    auto broker = mm.named_broker<caf::io::basp_broker>(caf::atom("BASP"));
    self->request(broker, timeout, caf::connect_atom::value, std::move(scribe), static_cast<uint16_t>(port))
        .receive(on_handshake, [&](caf::error& e) {
          failure = e == caf::sec::request_timeout
                        ? "no CAF handshake within " + std::to_string(options.connect_timeout.count()) + " ms"
                        : sys.render(e);
          if (tls) failure += " (over TLS: does each side trust the CA that signed the other's certificate?)";
        });
    if (!failure.empty()) throw ClusterError("cannot connect to node " + addr + ": " + failure);
    Json hello;
    self->request(n.manager, timeout, detail::hello_atom::value, kNodeProtocolVersion, session_actor)
        .receive([&](std::string& j) { hello = Json::parse(j); },
                 [&](caf::error& e) { failure = detail::error_text(sys, e); });
    if (!failure.empty()) throw ClusterError("node " + addr + " refused the controller: " + failure);
    n.session = hello.at("session").get<uint64_t>();
    const Json node = hello.at("node");
    n.info = NodeInfo::from_json(node);
    if (n.info.protocol_version != kNodeProtocolVersion)
      throw ClusterError("node " + addr + " speaks protocol v" + std::to_string(n.info.protocol_version) +
                         ", this controller v" + std::to_string(kNodeProtocolVersion));
    n.info.address = addr;
    return n;
  }
};

std::shared_ptr<RemoteLauncher> RemoteLauncher::connect(Runtime& runtime, ClusterOptions options) {
  auto& sys = actors::caf_protocol::system_of(runtime);
  if (!sys.has_middleman()) {
    if (runtime.owns_system())
      throw ValueError("RemoteLauncher::connect: the Runtime has no networking; create it with "
                       "RuntimeOptions{.network = true}");
    throw ValueError(
        "RemoteLauncher::connect: the actor system of this Runtime(system) has no middleman (CAF networking). In "
        "the application's caf::actor_system_config constructor, call hyflow::Runtime::configure_network(*this), or "
        "set the same by hand: load<caf::io::middleman>(); set(\"scheduler.policy\", caf::atom(\"sharing\")); "
        "set(\"middleman.heartbeat-interval\", caf::timespan{std::chrono::milliseconds(500)}); "
        "set(\"middleman.connection-timeout\", caf::timespan{std::chrono::milliseconds(3000)}) (the intervals as "
        "the caf-nodes' --heartbeat-ms and --connection-timeout-ms; docs/embedding.md)");
  }
  if (options.nodes.empty()) throw ValueError("RemoteLauncher: cluster.nodes is empty");
  auto addrs = options.nodes;
  for (const auto& a : addrs) detail::split_address(a);
  std::sort(addrs.begin(), addrs.end(), [](const std::string& a, const std::string& b) {
    auto x = detail::split_address(a), y = detail::split_address(b);
    return x < y;
  });
  if (std::adjacent_find(addrs.begin(), addrs.end()) != addrs.end())
    throw ValueError("cluster.nodes lists a node twice: " + *std::adjacent_find(addrs.begin(), addrs.end()));
  const bool tls = check_tls_files(options.tls, {"cluster.tls_cert", "cluster.tls_key", "cluster.tls_ca"});
  if (tls) {
    // CAF's TLS sessions read the files from the actor system's configuration and need the
    // openssl module, loaded when the system was built: the Runtime must carry the same files.
    if (!sys.has_openssl_manager())
      throw ValueError(
          "cluster TLS (cluster.tls_cert/tls_key/tls_ca) needs a Runtime created with CAF's openssl module "
          "and the same three files (hyflow::cluster::with_tls); this Runtime has no TLS");
    const auto& cfg = sys.config();
    if (cfg.openssl_certificate != options.tls.cert || cfg.openssl_key != options.tls.key ||
        cfg.openssl_cafile != options.tls.ca)
      throw ValueError("cluster TLS files differ from the Runtime's (certificate '" + cfg.openssl_certificate +
                       "', key '" + cfg.openssl_key + "', CA '" + cfg.openssl_cafile + "'); give both the same files");
  }
  install_data_plane();  // large DataProtos of remote calls
  DataPlane::set_process_token(data_plane_token(options.secret));  // the nodes' data servers require it
  auto impl = std::make_unique<Impl>(sys, std::move(options));
  impl->tls = tls;
  // The session actor: the nodes monitor it (when it goes, they stop our workers) and it
  // monitors their managers, so that a node that went down is known at once.
  impl->session_actor = sys.spawn<caf::hidden>([dead = impl->dead](caf::event_based_actor* self) -> caf::behavior {
    auto names = std::make_shared<std::map<caf::actor_addr, std::string>>();
    self->set_down_handler([=](caf::down_msg& dm) {
      auto it = names->find(dm.source);
      if (it == names->end()) return;
      std::lock_guard lock(dead->mutex);
      dead->nodes[it->second] = self->system().render(dm.reason);
    });
    return {[=](detail::watch_atom, caf::actor& manager, std::string& address) {
      (*names)[manager.address()] = address;
      self->monitor(manager);
    }};
  });
  impl->shutdown_guard = detail::spawn_shutdown_guard(sys);
  try {
    for (const auto& a : addrs) {
      impl->nodes.push_back(impl->connect_node(a));
      impl->infos.push_back(impl->nodes.back().info);
      caf::anon_send(impl->session_actor, detail::watch_atom::value, impl->nodes.back().manager, a);
    }
  } catch (...) {
    caf::anon_send_exit(impl->session_actor, caf::exit_reason::user_shutdown);
    caf::anon_send(impl->shutdown_guard, detail::guard_gone_atom::value);
    throw;
  }
  return std::shared_ptr<RemoteLauncher>(new RemoteLauncher(std::move(impl)));
}

RemoteLauncher::RemoteLauncher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemoteLauncher::~RemoteLauncher() {
  caf::anon_send_exit(impl_->session_actor, caf::exit_reason::user_shutdown);
  caf::anon_send(impl_->shutdown_guard, detail::guard_gone_atom::value);
}

const std::vector<NodeInfo>& RemoteLauncher::nodes() const {
  return impl_->infos;
}

const std::string& RemoteLauncher::job_id() const { return impl_->job; }

ResourcePool RemoteLauncher::pool(int workers_per_node, bool use_gpu) const {
  return pool(std::vector<int>(impl_->nodes.size(), workers_per_node), use_gpu);
}

ResourcePool RemoteLauncher::pool(std::vector<int> process_on_nodes, bool use_gpu) const {
  if (process_on_nodes.size() > impl_->nodes.size())
    throw ClusterError("resource shortfall: the pool needs " + std::to_string(process_on_nodes.size()) +
                       " nodes, the cluster has " + std::to_string(impl_->nodes.size()));
  for (size_t i = 0; i < process_on_nodes.size(); ++i)
    if (process_on_nodes[i] > 0) impl_->check_alive(i);
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

std::vector<actors::WorkerRef> RemoteLauncher::launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) {
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
  for (size_t idx : node_of) im.check_alive(idx);  // a dead node never answers: say so now
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
  self->request(master.manager, caf::timespan{im.options.spawn_timeout}, detail::port_atom::value, master.session)
      .receive([&](int32_t p) { master_port = p; }, [&](caf::error& e) { failure = detail::error_text(sys, e); });
  if (!failure.empty()) fail("node " + master.info.address + ": cannot reserve MASTER_PORT: " + failure);

  std::vector<WorkerEnv> placed = envs;
  for (size_t i = 0; i < placed.size(); ++i) {
    placed[i].master_addr = master.host;
    placed[i].master_port = master_port;
    placed[i].name += "@" + im.nodes[node_of[i]].info.address;
    placed[i].node = im.nodes[node_of[i]].info.address;
  }
  using spawn_handle =
      decltype(self->request(master.manager, caf::infinite, detail::spawn_atom::value, uint64_t{0}, std::string{}));
  std::vector<spawn_handle> spawns;
  for (size_t i = 0; i < placed.size(); ++i) {
    auto& n = im.nodes[node_of[i]];
    spawns.push_back(self->request(n.manager, caf::timespan{im.options.spawn_timeout}, detail::spawn_atom::value,
                                   n.session, placed[i].name));
  }
  for (size_t i = 0; i < spawns.size(); ++i)
    spawns[i].receive([&](caf::actor& a) { spawned.push_back(std::move(a)); },
                      [&](caf::error& e) {
                        if (failure.empty())
                          failure = "node " + im.nodes[node_of[i]].info.address + ": spawning rank " +
                                    std::to_string(i) + " failed: " + detail::error_text(sys, e);
                      });
  if (!failure.empty()) fail(failure);
  const std::string spec_json = spec.to_json().dump();
  std::vector<actors::caf_protocol::worker_actor> workers;
  for (auto& a : spawned) workers.push_back(caf::actor_cast<actors::caf_protocol::worker_actor>(a));
  using init_handle =
      decltype(self->request(workers[0], caf::infinite, actors::caf_protocol::init_atom::value, spec_json, spec_json));
  std::vector<init_handle> inits;
  for (size_t i = 0; i < workers.size(); ++i) {
    Json env = placed[i].to_json();
    env["JOB"] = im.job;
    inits.push_back(self->request(workers[i], caf::timespan{im.options.init_timeout},
                                  actors::caf_protocol::init_atom::value, spec_json, env.dump()));
  }
  int failed_rank = -1;
  for (size_t i = 0; i < inits.size(); ++i)
    inits[i].receive([](std::string&) {},
                     [&](caf::error& e) {
                       if (failure.empty()) failed_rank = static_cast<int>(i);
                       if (failed_rank == static_cast<int>(i))
                         failure = "constructing worker type '" + spec.type + "' failed on rank " + std::to_string(i) +
                                   " of " + std::to_string(workers.size()) + " (node " +
                                   im.nodes[node_of[i]].info.address + "): " + detail::error_text(sys, e);
                     });
  if (!failure.empty()) {
    for (auto& a : spawned) self->send_exit(a, caf::exit_reason::user_shutdown);
    throw CallError("__init__", failed_rank, failure, failure);
  }
  std::vector<actors::WorkerRef> out;
  for (size_t i = 0; i < workers.size(); ++i)
    out.push_back(actors::caf_protocol::make_worker_ref(workers[i], spec, placed[i], im.job));
  return out;
}

}  // namespace hyflow::cluster
