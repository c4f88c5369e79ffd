// The Runtime's lifecycle: its actor system (a private one, or the caller's), the launcher its
// groups use by default, detached workers, the transports it connects groups to, and stopping
// all of it in order (RuntimeCore::stop).
#include "caf_transport.hpp"
#include "in_process_launcher.hpp"
#include "runtime_core.hpp"

#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/actors/colocated.hpp>
#include <hyflow/actors/runtime.hpp>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include <algorithm>

namespace hyflow::actors::detail {

void RuntimeCore::stop() {
  std::vector<std::weak_ptr<CafTransport>> groups;
  std::vector<std::weak_ptr<CafWorkerHandle>> workers;
  std::vector<caf::actor_addr> local;
  std::map<std::string, WorkerRef> kept;
  std::shared_ptr<WorkerLauncher> placed_by;
  {
    std::lock_guard lock(mutex);
    if (!system_) return;
    groups.swap(transports);
    workers.swap(handles);
    local.swap(launched);
    kept.swap(detached);
    placed_by.swap(launcher);
  }
  for (auto& g : groups)
    if (auto t = g.lock()) t->stop();
  for (auto& addr : local)
    if (auto a = caf::actor_cast<caf::actor>(addr)) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  kept.clear();
  placed_by.reset();  // e.g. a RemoteLauncher ends its node sessions
  for (auto& w : workers)
    if (auto h = w.lock()) h->release();
  live->wait_all_ended();  // a worker in a long method is waited for: CAF cannot preempt it
  std::lock_guard lock(mutex);
  system_ = nullptr;
}

struct RuntimeConfig : caf::actor_system_config {
  explicit RuntimeConfig(const RuntimeOptions& o) {
    caf_protocol::register_types(*this);
    if (o.scheduler_threads > 0) set("scheduler.max-threads", static_cast<size_t>(o.scheduler_threads));
    if (o.network) Runtime::configure_network(*this, o.heartbeat_interval_ms, o.connection_timeout_ms);
    if (o.configure_system) o.configure_system(*this);  // e.g. the cluster module's TLS, after the middleman
  }
};

/// The private actor system of a Runtime that was not given one.
struct OwnedSystem {
  explicit OwnedSystem(const RuntimeOptions& o) : config(o), system(config) {}
  RuntimeConfig config;
  caf::actor_system system;
};

}  // namespace hyflow::actors::detail

namespace hyflow::actors::caf_protocol {

caf::actor_system& system_of(Runtime& runtime) { return runtime.core_->system("system_of"); }

}  // namespace hyflow::actors::caf_protocol

namespace hyflow::actors {

Runtime::Runtime(RuntimeOptions options) : owned_(std::make_unique<detail::OwnedSystem>(options)) {
  core_ = std::make_shared<detail::RuntimeCore>(owned_->system);
  register_colocated_worker_type();
  core_->launcher = std::make_shared<detail::InProcessLauncher>(core_);
}

Runtime::Runtime(caf::actor_system& system) {
  // Without the types, DataProto and Value messages would not even fail loudly between nodes
  // (CAF drops them with a line on stderr): refuse early, naming the fix.
  if (!system.config().value_factories_by_name.count("hyflow::Value") ||
      !system.config().error_renderers.count(caf::atom("hyflow")))
    throw ValueError(
        "Runtime(caf::actor_system&): the actor system's config lacks hyflow's types; call "
        "hyflow::Runtime::register_types(cfg) on its actor_system_config before creating the system");
  core_ = std::make_shared<detail::RuntimeCore>(system);
  register_colocated_worker_type();
  core_->launcher = std::make_shared<detail::InProcessLauncher>(core_);
}

Runtime::~Runtime() {
  core_->stop();
  owned_.reset();  // the private actor system ends here, on the thread that destroys the Runtime
}

void Runtime::register_types(caf::actor_system_config& cfg) { caf_protocol::register_types(cfg); }

void Runtime::configure_network(caf::actor_system_config& cfg, int heartbeat_interval_ms, int connection_timeout_ms) {
  cfg.load<caf::io::middleman>();
  // The middleman hands each incoming message to a BASP worker job on the scheduler. Idle
  // work-stealing threads only poll for jobs (sleeping 50 us to 10 ms between polls), which
  // cost 100-250 us per remote call (bench/cluster); the sharing policy's threads wait on a
  // condition variable and wake at once. The workers run on their own threads either way.
  cfg.set("scheduler.policy", caf::atom("sharing"));
  if (heartbeat_interval_ms > 0)
    cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(heartbeat_interval_ms)});
  if (connection_timeout_ms > 0)
    cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(connection_timeout_ms)});
}

bool Runtime::owns_system() const { return owned_ != nullptr; }

WorkerLauncher& Runtime::launcher() {
  std::lock_guard lock(core_->mutex);
  return *core_->launcher;
}

void Runtime::set_launcher(std::shared_ptr<WorkerLauncher> launcher) {
  if (!launcher) throw ValueError("Runtime::set_launcher: null launcher");
  std::lock_guard lock(core_->mutex);
  core_->launcher = std::move(launcher);
}

std::shared_ptr<WorkerLauncher> Runtime::in_process_launcher() {
  return std::make_shared<detail::InProcessLauncher>(core_);
}

void Runtime::keep_detached(const std::vector<WorkerRef>& workers) {
  core_->remember(workers);
  std::lock_guard lock(core_->mutex);
  for (const auto& w : workers) core_->detached[w->env().name] = w;
}

WorkerRef Runtime::find_detached(const std::string& name) const {
  std::lock_guard lock(core_->mutex);
  auto it = core_->detached.find(name);
  if (it == core_->detached.end()) {
    std::string known;
    for (const auto& [k, v] : core_->detached) known += (known.empty() ? "" : ", ") + k;
    throw KeyError("no detached worker named '" + name + "' (known: " + (known.empty() ? "none" : known) + ")");
  }
  return it->second;
}

std::shared_ptr<detail::Transport> Runtime::connect(std::vector<WorkerRef> workers, bool owns_workers) {
  core_->remember(workers);
  auto transport = std::make_shared<detail::CafTransport>(core_, std::move(workers), owns_workers);
  std::lock_guard lock(core_->mutex);
  auto& ts = core_->transports;
  ts.erase(std::remove_if(ts.begin(), ts.end(), [](const auto& w) { return w.expired(); }), ts.end());
  ts.push_back(transport);
  return transport;
}

}  // namespace hyflow::actors
