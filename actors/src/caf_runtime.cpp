// CAF plumbing of the runtime: the worker actor, the per-group collector (sends per-rank
// requests, monitors workers, runs the watchdog) and the in-process launcher. The call
// pipeline itself (worker_group.cpp) never sees CAF.
#include <hyflow/actors/caf_inspect.hpp>
#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/actors/colocated.hpp>
#include <hyflow/actors/detail/pending_call.hpp>
#include <hyflow/actors/group_actor.hpp>
#include <hyflow/actors/payload_transfer.hpp>
#include <hyflow/actors/runtime.hpp>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include <cxxabi.h>

#include <algorithm>
#include <condition_variable>

#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<hyflow::actors::detail::PendingCall>)  // in-process only

namespace hyflow::actors::detail {

using caf_protocol::call_atom;
using caf_protocol::errc;
using caf_protocol::init_atom;
using caf_protocol::worker_actor;
using submit_atom = caf::atom_constant<caf::atom("hf_submit")>;
using tick_atom = caf::atom_constant<caf::atom("hf_tick")>;
using kill_atom = caf::atom_constant<caf::atom("hf_kill")>;
using done_atom = caf::atom_constant<caf::atom("hf_done")>;

inline caf::error make_error(errc code, std::string kind, std::string message) {
  return {static_cast<uint8_t>(code), caf::atom("hyflow"), caf::make_message(std::move(kind), std::move(message))};
}

/// A worker actor (local, or a proxy of a remote one) for the call pipeline. The Runtime
/// releases the actor when it stops, so that no handle of its actor system outlives it.
class CafWorkerHandle : public WorkerHandle {
 public:
  CafWorkerHandle(worker_actor a, WorkerSpec s, WorkerEnv e, std::string job)
      : actor_(std::move(a)), spec_(std::move(s)), env_(std::move(e)), job_(std::move(job)) {}
  const WorkerEnv& env() const override { return env_; }
  const WorkerSpec& spec() const override { return spec_; }
  /// Null once released.
  worker_actor actor() const {
    std::lock_guard lock(mutex_);
    return actor_;
  }
  void release() {
    std::lock_guard lock(mutex_);
    actor_ = nullptr;
  }
  /// The job (controller session) its remote launcher started it for; empty: none.
  const std::string& job() const { return job_; }

 private:
  mutable std::mutex mutex_;
  worker_actor actor_;
  WorkerSpec spec_;
  WorkerEnv env_;
  std::string job_;
};

/// Counts the runtime's local actors (collectors, in-process workers) that have not
/// terminated, so that stopping can wait for them on a thread that is not theirs.
class LiveActors : public std::enable_shared_from_this<LiveActors> {
 public:
  void track(caf::abstract_actor* actor) {
    {
      std::lock_guard lock(mutex_);
      ++running_;
    }
    actor->attach_functor([self = shared_from_this()] { self->ended(); });
  }
  void wait_all_ended() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return running_ == 0; });
  }

 private:
  void ended() {
    std::lock_guard lock(mutex_);
    if (--running_ == 0) cv_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  size_t running_ = 0;
};

class CafTransport;

/// What a Runtime shares with its groups: never the actor system itself, only a pointer to it
/// that stop() clears. Groups, futures and worker handles may outlive the Runtime; the system
/// is torn down (when the Runtime owns it) by ~Runtime on the thread that destroys it.
class RuntimeCore {
 public:
  explicit RuntimeCore(caf::actor_system& sys) : system_(&sys) {}
  /// The actor system; RuntimeStoppedError (naming `what`) once stopped.
  caf::actor_system& system(const std::string& what) {
    std::lock_guard lock(mutex);
    if (!system_) throw RuntimeStoppedError(what);
    return *system_;
  }
  /// Stops every group (their pending calls fail with RuntimeStoppedError), every worker it
  /// launched in this process, and releases every handle and launcher; returns once this
  /// process's workers and collectors have terminated. Idempotent.
  void stop();

  std::mutex mutex;
  std::vector<std::weak_ptr<CafTransport>> transports;
  std::vector<std::weak_ptr<CafWorkerHandle>> handles;
  std::vector<caf::actor_addr> launched;
  std::map<std::string, WorkerRef> detached;
  std::shared_ptr<WorkerLauncher> launcher;
  /// Outlives this core: attached functors of late-ending actors still reach it.
  std::shared_ptr<LiveActors> live = std::make_shared<LiveActors>();

  void remember(const std::vector<WorkerRef>& workers) {
    std::lock_guard lock(mutex);
    for (const auto& w : workers)
      if (auto h = std::dynamic_pointer_cast<CafWorkerHandle>(w)) handles.push_back(h);
  }

 private:
  caf::actor_system* system_;
};

namespace {

/// The class of an exception, for messages ("ValueError: ...", "std::runtime_error: ..."): the
/// unqualified name of a hyflow error's dynamic type (DataPlaneError, ClusterError, ... from
/// modules above this one included), the full demangled name of any other exception.
std::string kind_of(const std::exception& e) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status),
                                              std::free);
  if (status != 0 || !name) return dynamic_cast<const Error*>(&e) ? "Error" : "std::exception";
  std::string full(name.get());
  if (!dynamic_cast<const Error*>(&e)) return full;
  const auto colon = full.rfind("::");
  return colon == std::string::npos ? full : full.substr(colon + 2);
}

/// Whether this process's CAF connections are TLS (the data plane is not encrypted).
bool uses_tls(caf::actor_system& sys) { return !sys.config().openssl_certificate.empty(); }

// ---- worker actor --------------------------------------------------------------------------

struct worker_state {
  WorkerSpec spec;
  WorkerEnv env;
  std::string job;  ///< the launching controller's job id ("JOB" in the env message; empty: none)
  CreatedWorker created;
  static inline const char* name = "hyflow.worker";
};

worker_actor::behavior_type worker_behavior(worker_actor::stateful_pointer<worker_state> self) {
  return {
      [=](init_atom, const std::string& spec_json, const std::string& env_json) -> caf::result<std::string> {
        auto& st = self->state;
        try {
          st.spec = WorkerSpec::from_json(Json::parse(spec_json));
          const Json env = Json::parse(env_json);
          st.env = WorkerEnv::from_json(env);
          if (env.contains("JOB")) st.job = env.at("JOB").get<std::string>();
          // constructors can read rank(), world_size(), ...; every role shares this worker's host
          WorkerEnvScope scope(st.env, std::make_shared<WorkerHost>());
          st.created = create_worker(st.spec);
          return st.env.name;
        } catch (const std::exception& e) {
          return make_error(errc::init_failed, kind_of(e), e.what());
        }
      },
      [=](call_atom, const std::string& method, std::vector<Value>& args) -> caf::result<Value> {
        auto& st = self->state;
        if (!st.created.worker) return make_error(errc::method_failed, "Error", "worker is not initialized");
        try {
          const MethodEntry& entry = st.created.table->at(method, st.spec.type);
          // Large DataProtos to and from another process travel over the data plane.
          const bool remote = self->current_sender() && self->current_sender()->node() != self->node();
          const auto transfer = remote ? payload_transfer() : nullptr;
          if (transfer) transfer->import_handles(args, st.job);
          if (entry.options.materialize_futures)
            for (auto& a : args)
              if (a.is_future()) a = a.materialized();
          Value result = entry.invoke(*st.created.worker, args);
          if (transfer && transfer->in_use(uses_tls(self->system())))
            transfer->export_large(result, /*expires=*/true, st.job);
          return result;
        } catch (const WorkerExit& e) {
          // A crash: no answer; the collector learns from the down message.
          self->quit(make_error(errc::worker_exit, "exit", e.reason));
          return self->make_response_promise<Value>();
        } catch (const std::exception& e) {
          return make_error(errc::method_failed, kind_of(e), e.what());
        }
      },
  };
}

worker_actor actor_of(const WorkerRef& w) {
  auto* h = dynamic_cast<CafWorkerHandle*>(w.get());
  if (!h) throw ValueError("worker '" + w->env().name + "' was not launched by this runtime");
  auto a = h->actor();
  if (!a) throw RuntimeStoppedError("worker '" + w->env().name + "'");
  return a;
}

std::string context_string(const caf::error& e, size_t i) {
  const auto& ctx = e.context();
  if (ctx.size() > i && ctx.match_element<std::string>(i)) return ctx.get_as<std::string>(i);
  return {};
}

// ---- collector: one per group --------------------------------------------------------------

struct collector_state {
  std::vector<worker_actor> workers;
  std::vector<std::string> names;
  std::string job;  ///< the workers' job (their remote launcher's session id; empty: none)
  std::shared_ptr<std::vector<std::atomic<bool>>> alive;
  std::vector<std::string> death;  ///< why a rank died ("" while alive)
  std::map<uint64_t, std::shared_ptr<PendingCall>> calls;
  uint64_t next_id = 0;
  bool tick_armed = false;
  /// Remote ranks whose arguments are futures still pending: futures do not cross the
  /// network, so they are sent once the futures resolve (checked on every tick).
  struct Deferred {
    uint64_t id;
    std::shared_ptr<PendingCall> call;
    size_t index;
    std::vector<Value> args;
  };
  std::vector<Deferred> deferred;
  static inline const char* name = "hyflow.collector";
  collector_state() = default;
  collector_state(const collector_state&) = delete;
  collector_state& operator=(const collector_state&) = delete;
  /// The collector ends with its group or its Runtime: calls still pending (the group's
  /// Runtime stopped) fail instead of leaving their callers waiting.
  ~collector_state() {
    auto fail_all = [](const std::shared_ptr<PendingCall>& call) {
      auto error = std::make_exception_ptr(RuntimeStoppedError(call->method));
      for (size_t i = 0; i < call->ranks.size(); ++i)
        if (!call->settled(i)) call->fail(i, error);
    };
    for (auto& [id, call] : calls) fail_all(call);
    for (auto& d : deferred) fail_all(d.call);
  }
};

using collector_actor = caf::stateful_actor<collector_state>;

std::string rank_label(const collector_state& st, int rank) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(st.workers.size()) + " (worker '" +
         st.names[static_cast<size_t>(rank)] + "')";
}

std::exception_ptr died(const collector_state& st, const std::string& method, int rank) {
  const std::string& why = st.death[static_cast<size_t>(rank)];
  return std::make_exception_ptr(WorkerDiedError(
      method, rank, why, "method '" + method + "': " + rank_label(st, rank) + " is dead: " + why));
}

std::exception_ptr to_exception(caf::actor_system& sys, const collector_state& st, const caf::error& e,
                                 const std::string& method, int rank) {
  if (e.category() == caf::atom("hyflow")) {
    const std::string kind = context_string(e, 0), message = context_string(e, 1);
    if (e.code() == static_cast<uint8_t>(errc::worker_exit))
      return std::make_exception_ptr(WorkerDiedError(
          method, rank, message, "method '" + method + "': " + rank_label(st, rank) + " exited: " + message));
    return std::make_exception_ptr(CallError(method, rank, message,
                                             "method '" + method + "' failed on " + rank_label(st, rank) + ": " + kind +
                                                 ": " + message,
                                             kind));
  }
  if (e == caf::sec::request_receiver_down)
    return std::make_exception_ptr(WorkerDiedError(method, rank, "worker is down",
                                                   "method '" + method + "': " + rank_label(st, rank) + " is dead"));
  const std::string text = sys.render(e);
  return std::make_exception_ptr(
      CallError(method, rank, text, "method '" + method + "' failed on " + rank_label(st, rank) + ": " + text));
}

void forget_done(collector_state& st) {
  for (auto it = st.calls.begin(); it != st.calls.end();)
    it = it->second->done() ? st.calls.erase(it) : std::next(it);
}

void arm_tick(collector_actor* self) {
  if (self->state.tick_armed) return;
  self->state.tick_armed = true;
  self->delayed_send(self, std::chrono::milliseconds(20), tick_atom::value);
}

void check_deadlines(collector_actor* self) {
  auto& st = self->state;
  const auto now = PendingCall::Clock::now();
  bool waiting = false;
  for (auto& [id, call] : st.calls) {
    if (!call->deadline || call->done()) continue;
    if (now < *call->deadline) {
      waiting = true;
      continue;
    }
    auto late = call->unanswered();
    if (late.empty() || !call->take_deadline_report()) continue;
    DeadlineReport report{call->method, late,
                          std::chrono::duration_cast<std::chrono::milliseconds>(now - call->start)};
    std::string ranks;
    for (int r : late) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    const std::string line = "hyflow watchdog: method '" + call->method + "' exceeded its deadline after " +
                             std::to_string(report.elapsed.count()) + " ms; no answer from rank(s) " + ranks;
    std::cerr << line << std::endl;
    if (call->on_deadline) {
      call->on_deadline(report);
    } else {
      for (int r : late)
        call->fail(static_cast<size_t>(call->index_of(r)),
                   std::make_exception_ptr(CallTimeoutError(call->method, late, line)));
    }
  }
  forget_done(st);
  if (waiting) arm_tick(self);
}

bool has_pending_future(const std::vector<Value>& args) {
  for (const auto& a : args)
    if ((a.is_dataproto_future() && !a.dataproto_future().is_ready()) || a.is_value_future()) return true;
  return false;
}

/// A remote rank's result that holds data plane handles: the objects are pulled from the
/// worker's node on a short thread of its own (ranks in parallel, and the collector keeps
/// serving down messages and deadlines meanwhile), which then delivers or fails the rank.
/// False when `v` holds no handle: the caller delivers it.
bool receive_remote(collector_actor* self, const std::shared_ptr<PendingCall>& call, size_t i, int rank, Value& v) {
  auto transfer = payload_transfer();
  if (!transfer || !transfer->has_handles(v)) return false;
  if (call->settled(i)) {  // too late (deadline, death): free the objects at their holder
    transfer->discard_handles(v, self->state.job);
    return true;
  }
  auto result = std::make_shared<Value>(std::move(v));
  auto pull = [call, i, rank, transfer, label = rank_label(self->state, rank), result, job = self->state.job] {
    try {
      transfer->import_handles(*result, job);
      call->deliver(i, std::move(*result));
    } catch (const std::exception& e) {
      call->fail(i, std::make_exception_ptr(CallError(call->method, rank, e.what(),
                                                      "method '" + call->method + "': the result of " + label +
                                                          " could not be received: " + e.what())));
    }
  };
  try {
    std::thread(pull).detach();
  } catch (const std::system_error&) {  // no thread to be had: pull here
    pull();
  }
  return true;
}

void send_call(collector_actor* self, uint64_t id, const std::shared_ptr<PendingCall>& call, size_t i,
               std::vector<Value> args) {
  const int rank = call->ranks[i];
  auto& st = self->state;
  const bool remote = st.workers[static_cast<size_t>(rank)].node() != self->node();
  if (remote) {
    try {  // resolved futures become plain values for the wire; large DataProtos go by data plane
      for (auto& a : args)
        if (a.is_future()) a = a.materialized();
      const auto transfer = payload_transfer();
      if (transfer && transfer->in_use(uses_tls(self->system())))
        if (auto release = transfer->export_large(args, /*expires=*/false, st.job))
          call->on_settled(i, std::move(release));  // fetched by the worker, or freed once the rank settles
    } catch (...) {
      call->fail(i, std::current_exception());
      if (call->done()) st.calls.erase(id);
      return;
    }
  }
  self->request(st.workers[static_cast<size_t>(rank)], caf::infinite, call_atom::value, call->method, std::move(args))
      .then(
          [self, id, call, i, rank, remote](Value& v) {
            if (!remote || !receive_remote(self, call, i, rank, v)) call->deliver(i, std::move(v));
            if (call->done()) self->state.calls.erase(id);
          },
          [self, id, call, i, rank](caf::error& e) {
            auto error = to_exception(self->system(), self->state, e, call->method, rank);
            call->fail(i, error);
            // A dead worker (its exit, or its node gone) fails the whole call now, as its down
            // message would: the other ranks may be waiting for it.
            const auto exit_category = caf::make_error(caf::exit_reason::remote_link_unreachable).category();
            const bool death = e == caf::sec::request_receiver_down || e.category() == exit_category ||
                               (e.category() == caf::atom("hyflow") &&
                                e.code() == static_cast<uint8_t>(errc::worker_exit));
            if (death)
              for (size_t j = 0; j < call->ranks.size(); ++j)
                if (!call->settled(j)) call->fail(j, error);
            if (call->done()) self->state.calls.erase(id);
          });
}

void send_deferred(collector_actor* self) {
  auto& st = self->state;
  std::vector<collector_state::Deferred> still;
  auto ready = std::move(st.deferred);
  st.deferred.clear();
  for (auto& d : ready) {
    if (d.call->done()) continue;
    if (!st.death[static_cast<size_t>(d.call->ranks[d.index])].empty()) {
      d.call->fail(d.index, died(st, d.call->method, d.call->ranks[d.index]));
      continue;
    }
    bool pending = false;
    for (const auto& a : d.args)
      if (a.is_dataproto_future() && !a.dataproto_future().is_ready()) pending = true;
    if (pending) still.push_back(std::move(d));
    else send_call(self, d.id, d.call, d.index, std::move(d.args));
  }
  for (auto& d : still) st.deferred.push_back(std::move(d));
  forget_done(st);
  if (!st.deferred.empty()) arm_tick(self);
}

caf::behavior collector_behavior(collector_actor* self, std::vector<worker_actor> workers,
                                 std::vector<std::string> names, std::string job,
                                 std::shared_ptr<std::vector<std::atomic<bool>>> alive) {
  auto& st = self->state;
  st.workers = std::move(workers);
  st.names = std::move(names);
  st.job = std::move(job);
  st.alive = std::move(alive);
  st.death.assign(st.workers.size(), "");
  for (auto& w : st.workers) self->monitor(w);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t r = 0; r < st.workers.size(); ++r) {
      if (st.workers[r].address() != dm.source) continue;
      // A worker's own exit (exit_worker, or its node shutting down) carries its words.
      const bool own = dm.reason.category() == caf::atom("hyflow") && !context_string(dm.reason, 1).empty();
      st.death[r] = own                                       ? context_string(dm.reason, 1)
                    : dm.reason == caf::exit_reason::kill ? "killed"
                                                          : self->system().render(dm.reason);
      if (st.death[r].empty()) st.death[r] = "stopped";
      (*st.alive)[r] = false;
      for (auto& [id, call] : st.calls) {
        int i = call->index_of(static_cast<int>(r));
        if (i < 0 || call->settled(static_cast<size_t>(i))) continue;
        // The call cannot succeed any more: it fails now, naming this rank, instead of after
        // the survivors answer (they may wait for the dead one, e.g. inside a collective).
        // Every unsettled rank gets the same error; their late answers are dropped.
        auto error = died(st, call->method, static_cast<int>(r));
        for (size_t j = 0; j < call->ranks.size(); ++j)
          if (!call->settled(j)) call->fail(j, error);
      }
    }
    forget_done(st);
  });
  return {
      [=](submit_atom, std::shared_ptr<PendingCall>& call) {
        auto& st = self->state;
        forget_done(st);  // calls completed off this thread (data plane pulls)
        const uint64_t id = st.next_id++;
        st.calls.emplace(id, call);
        for (size_t i = 0; i < call->ranks.size(); ++i) {
          const int rank = call->ranks[i];
          if (!st.death[static_cast<size_t>(rank)].empty()) {
            call->fail(i, died(st, call->method, rank));
            continue;
          }
          if (st.workers[static_cast<size_t>(rank)].node() != self->node() && has_pending_future(call->args[i])) {
            st.deferred.push_back({id, call, i, std::move(call->args[i])});
            continue;
          }
          send_call(self, id, call, i, std::move(call->args[i]));
        }
        call->args.clear();
        if (call->done()) st.calls.erase(id);  // every rank was dead already
        else if (call->deadline || !st.deferred.empty()) arm_tick(self);
      },
      [=](tick_atom) {
        self->state.tick_armed = false;
        send_deferred(self);
        check_deadlines(self);
      },
      [=](kill_atom, int rank) {
        self->send_exit(self->state.workers[static_cast<size_t>(rank)], caf::exit_reason::kill);
      },
  };
}

}  // namespace

class CafTransport : public Transport {
 public:
  CafTransport(std::shared_ptr<RuntimeCore> core, std::vector<WorkerRef> workers, bool owns)
      : core_(std::move(core)), workers_(std::move(workers)), owns_(owns),
        alive_(std::make_shared<std::vector<std::atomic<bool>>>(workers_.size())) {
    std::vector<worker_actor> actors;
    std::vector<std::string> names;
    std::string job;
    for (auto& w : workers_) {
      actors.push_back(actor_of(w));
      names.push_back(w->env().name);
      if (auto* h = dynamic_cast<CafWorkerHandle*>(w.get()); h && job.empty()) job = h->job();
    }
    for (auto& a : *alive_) a = true;
    auto& sys = core_->system("a new worker group");
    collector_ = sys.spawn<caf::detached>(collector_behavior, std::move(actors), std::move(names), std::move(job),
                                          alive_);
    core_->live->track(caf::actor_cast<caf::abstract_actor*>(collector_));
  }
  ~CafTransport() override { stop(); }
  const std::vector<WorkerRef>& workers() const override { return workers_; }
  void submit(std::shared_ptr<PendingCall> call) override {
    std::lock_guard lock(mutex_);
    if (!collector_) throw RuntimeStoppedError(call->method);
    caf::anon_send(collector_, submit_atom::value, std::move(call));
  }
  void kill(int rank) override {
    std::lock_guard lock(mutex_);
    if (collector_) caf::anon_send(collector_, kill_atom::value, rank);
  }
  bool alive(int rank) const override { return (*alive_)[static_cast<size_t>(rank)]; }

  /// Ends the collector (its pending calls fail) and, when this group owns them, the workers;
  /// drops the actor handles. Later calls fail with RuntimeStoppedError. Idempotent.
  void stop() {
    std::lock_guard lock(mutex_);
    if (!collector_) return;
    caf::anon_send_exit(collector_, caf::exit_reason::user_shutdown);
    collector_ = nullptr;
    if (owns_)
      for (auto& w : workers_)
        if (auto a = static_cast<CafWorkerHandle&>(*w).actor()) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

 private:
  std::shared_ptr<RuntimeCore> core_;  // small: holds no actor system
  std::vector<WorkerRef> workers_;
  bool owns_;
  std::shared_ptr<std::vector<std::atomic<bool>>> alive_;
  std::mutex mutex_;
  caf::actor collector_;
};

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

// ---- runtime core and in-process launcher -------------------------------------------------

struct RuntimeConfig : caf::actor_system_config {
  explicit RuntimeConfig(const RuntimeOptions& o) {
    caf_protocol::register_types(*this);
    if (o.scheduler_threads > 0) set("scheduler.max-threads", static_cast<size_t>(o.scheduler_threads));
    if (o.network) {
      load<caf::io::middleman>();
      // The middleman hands each incoming message to a BASP worker job on the scheduler. Idle
      // work-stealing threads only poll for jobs (sleeping 50 us to 10 ms between polls), which
      // cost 100-250 us per remote call (bench/cluster); the sharing policy's threads wait on a
      // condition variable and wake at once. The workers run on their own threads either way.
      set("scheduler.policy", caf::atom("sharing"));
      if (o.heartbeat_interval_ms > 0)
        set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(o.heartbeat_interval_ms)});
      if (o.connection_timeout_ms > 0)
        set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(o.connection_timeout_ms)});
    }
    if (o.configure_system) o.configure_system(*this);  // e.g. the cluster module's TLS, after the middleman
  }
};

/// The private actor system of a Runtime that was not given one.
struct OwnedSystem {
  explicit OwnedSystem(const RuntimeOptions& o) : config(o), system(config) {}
  RuntimeConfig config;
  caf::actor_system system;
};

namespace {
class InProcessLauncher : public WorkerLauncher {
 public:
  explicit InProcessLauncher(std::weak_ptr<RuntimeCore> core) : core_(std::move(core)) {}
  std::vector<WorkerRef> launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) override {
    auto core = core_.lock();
    if (!core) throw RuntimeStoppedError("__init__");
    auto& sys = core->system("__init__");
    std::vector<worker_actor> actors;
    for (size_t i = 0; i < envs.size(); ++i) {
      actors.push_back(caf_protocol::spawn_worker(sys));
      core->live->track(caf::actor_cast<caf::abstract_actor*>(actors.back()));
    }
    {
      std::lock_guard lock(core->mutex);
      for (auto& a : actors) core->launched.push_back(a.address());
    }
    caf::scoped_actor self{sys};
    const std::string spec_json = spec.to_json().dump();
    std::vector<decltype(self->request(actors[0], caf::infinite, init_atom::value, spec_json, spec_json))> pending;
    for (size_t i = 0; i < envs.size(); ++i)
      pending.push_back(self->request(actors[i], caf::infinite, init_atom::value, spec_json, envs[i].to_json().dump()));
    std::exception_ptr failure;
    for (size_t i = 0; i < pending.size(); ++i)
      pending[i].receive([](std::string&) {},
                         [&](caf::error& e) {
                           if (failure) return;
                           const std::string msg = context_string(e, 1).empty()
                                                       ? sys.render(e)
                                                       : context_string(e, 0) + ": " + context_string(e, 1);
                           failure = std::make_exception_ptr(
                               CallError("__init__", static_cast<int>(i), msg,
                                         "constructing worker type '" + spec.type + "' failed on rank " +
                                             std::to_string(i) + " of " + std::to_string(envs.size()) + ": " + msg));
                         });
    if (failure) {
      for (auto& a : actors) self->send_exit(a, caf::exit_reason::user_shutdown);
      std::rethrow_exception(failure);
    }
    std::vector<WorkerRef> out;
    for (size_t i = 0; i < envs.size(); ++i) out.push_back(caf_protocol::make_worker_ref(actors[i], spec, envs[i]));
    return out;
  }

 private:
  std::weak_ptr<RuntimeCore> core_;
};
}  // namespace

}  // namespace hyflow::actors::detail

namespace hyflow::actors::caf_protocol {

void register_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<DataProto>("hyflow::DataProto");
  cfg.add_message_type<Value>("hyflow::Value");
  // No actor type: CAF's remote spawn service would create workers for any connected peer,
  // outside the node manager's access control (docs/cluster.md, "Security model").
  cfg.add_error_category(caf::atom("hyflow"), [](uint8_t code, caf::atom_value, const caf::message& ctx) {
    return "hyflow::" + to_string(static_cast<errc>(code)) + (ctx.empty() ? "" : caf::to_string(ctx));
  });
}

std::string to_string(errc code) {
  switch (code) {
    case errc::method_failed: return "method_failed";
    case errc::init_failed: return "init_failed";
    case errc::worker_exit: return "worker_exit";
    case errc::call_timeout: return "call_timeout";
    case errc::runtime_stopped: return "runtime_stopped";
    case errc::call_failed: return "call_failed";
  }
  return "unknown(" + std::to_string(static_cast<int>(code)) + ")";
}

worker_actor spawn_worker(caf::actor_system& sys) { return sys.spawn<caf::detached>(detail::worker_behavior); }

WorkerRef make_worker_ref(worker_actor actor, WorkerSpec spec, WorkerEnv env, std::string job) {
  return std::make_shared<detail::CafWorkerHandle>(std::move(actor), std::move(spec), std::move(env), std::move(job));
}

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

// ---- the group as a CAF actor ---------------------------------------------------------------

namespace hyflow::actors {

namespace detail {
namespace {
struct group_state {
  std::optional<WorkerGroup> group;
  uint64_t next_id = 0;
  std::map<uint64_t, caf::typed_response_promise<Value>> promises;
  static inline const char* name = "hyflow.group";
};

caf::error group_error(caf_protocol::errc code, std::string kind, std::string what, std::string method, int rank) {
  return {static_cast<uint8_t>(code), caf::atom("hyflow"),
          caf::make_message(std::move(kind), std::move(what), std::move(method), static_cast<int32_t>(rank))};
}

/// Runs group calls for CAF requests; answers from the group's completion, which it is sent
/// as a message (a response promise is delivered on the actor's own thread only).
caf::behavior group_behavior(caf::stateful_actor<group_state>* self, WorkerGroup group) {
  self->state.group.emplace(std::move(group));
  return {
      [=](call_atom, std::string& method, std::vector<Value>& args) -> caf::result<Value> {
        auto& st = self->state;
        const uint64_t id = st.next_id++;
        auto me = caf::actor_cast<caf::actor>(self);  // alive until the answer is in
        try {
          st.group->call_then(
              method, std::move(args), [me, id](Value v) { caf::anon_send(me, done_atom::value, id, std::move(v)); },
              [me, id](std::exception_ptr e) { caf::anon_send(me, done_atom::value, id, to_caf_error(e)); });
        } catch (...) {
          return to_caf_error(std::current_exception());
        }
        auto promise = self->make_response_promise<Value>();
        st.promises.emplace(id, promise);
        return promise;
      },
      [=](done_atom, uint64_t id, Value& v) {
        auto it = self->state.promises.find(id);
        if (it == self->state.promises.end()) return;
        it->second.deliver(std::move(v));
        self->state.promises.erase(it);
      },
      [=](done_atom, uint64_t id, caf::error& e) {
        auto it = self->state.promises.find(id);
        if (it == self->state.promises.end()) return;
        it->second.deliver(std::move(e));
        self->state.promises.erase(it);
      },
  };
}
}  // namespace
}  // namespace detail

group_actor spawn_group_actor(caf::actor_system& system, WorkerGroup group) {
  return caf::actor_cast<group_actor>(system.spawn(detail::group_behavior, std::move(group)));
}

caf::error to_caf_error(std::exception_ptr error) {
  using caf_protocol::errc;
  using detail::group_error;
  try {
    std::rethrow_exception(error);
  } catch (const RuntimeStoppedError& e) {
    return group_error(errc::runtime_stopped, "RuntimeStoppedError", e.what(), e.method(), e.rank());
  } catch (const CallTimeoutError& e) {
    return group_error(errc::call_timeout, "CallTimeoutError", e.what(), e.method(), e.rank());
  } catch (const WorkerDiedError& e) {
    return group_error(errc::worker_exit, "WorkerDiedError", e.what(), e.method(), e.rank());
  } catch (const CallError& e) {
    return group_error(errc::method_failed, e.kind().empty() ? "CallError" : e.kind(), e.what(), e.method(),
                       e.rank());
  } catch (const std::exception& e) {
    return group_error(errc::call_failed, detail::kind_of(e), e.what(), "", -1);
  } catch (...) {
    return group_error(errc::call_failed, "unknown", "an exception that is not a std::exception", "", -1);
  }
}

std::string error_kind(const caf::error& e) {
  return e.category() == caf::atom("hyflow") ? detail::context_string(e, 0) : std::string();
}

std::string error_message(const caf::error& e) {
  return e.category() == caf::atom("hyflow") ? detail::context_string(e, 1) : std::string();
}

}  // namespace hyflow::actors
