// The collector, one per group: sends each rank its request, monitors the workers (a death
// fails the calls that wait for it at once) and runs the watchdog (call deadlines, and remote
// sends deferred until their argument futures resolve).
#include "call_collector.hpp"

#include "worker_actor.hpp"

#include <hyflow/actors/caf_inspect.hpp>
#include <hyflow/actors/call_trace.hpp>
#include <hyflow/actors/payload_transfer.hpp>

#include <caf/all.hpp>

#include <iostream>
#include <map>
#include <system_error>
#include <thread>

namespace hyflow::actors::detail {

using caf_protocol::call_atom;
using caf_protocol::errc;
using caf_protocol::worker_actor;

namespace {

using tick_atom = caf::atom_constant<caf::atom("hf_tick")>;

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

/// A node's link broke (its process was killed or crashed, or the network cut it off): every
/// rank on it is gone at once, though CAF reports them one by one. Marks them all dead with one
/// reason that names the node ("host:port", from the workers' names "...@host:port") and all its
/// ranks, as a node that shuts down says it (SIGTERM).
void node_lost(collector_state& st, const caf::node_id& node) {
  std::vector<size_t> on_node;
  for (size_t r = 0; r < st.workers.size(); ++r)
    if (st.workers[r].node() == node) on_node.push_back(r);
  if (on_node.empty()) return;
  const std::string& name = st.names[on_node.front()];
  const auto at = name.rfind('@');
  const std::string host = at == std::string::npos ? "(in this process)" : name.substr(at + 1);
  std::string ranks;
  for (size_t r : on_node) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  const std::string why = "node " + host +
                          " is unreachable (its process was killed or crashed, or the network cut it off); ranks " +
                          ranks + " of " + std::to_string(st.workers.size()) + " were on it";
  for (size_t r : on_node) {
    if (!st.death[r].empty()) continue;
    st.death[r] = why;
    (*st.alive)[r] = false;
  }
}

bool link_lost(const caf::error& e) {
  return e == caf::exit_reason::remote_link_unreachable;
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
    std::string ranks;  // "3 (worker 'EchoWorker_1:1@host:port')": the name says the node
    for (int r : late)
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r) + " (worker '" + st.names[static_cast<size_t>(r)] + "')";
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
      TraceSpan span("transfer", call->method, " transfer in");
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
      TraceSpan span("transfer", call->method, " transfer out");
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
  // The step timeline: a remote worker's execution as this process sees it (an in-process
  // worker records its own, call_trace.hpp); its clock is not ours.
  const auto sent = remote && CallTrace::active() ? CallTrace::Clock::now() : CallTrace::Clock::time_point{};
  self->request(st.workers[static_cast<size_t>(rank)], caf::infinite, call_atom::value, call->method, std::move(args))
      .then(
          [self, id, call, i, rank, remote, sent](Value& v) {
            if (auto* trace = CallTrace::active(); trace && remote && sent != CallTrace::Clock::time_point{})
              trace->add_observed(CallTrace::worker_track(self->state.names[static_cast<size_t>(rank)], rank),
                                  call->method, "execute (observed)", sent, CallTrace::Clock::now());
            if (!remote || !receive_remote(self, call, i, rank, v)) call->deliver(i, std::move(v));
            if (call->done()) self->state.calls.erase(id);
          },
          [self, id, call, i, rank](caf::error& e) {
            if (link_lost(e)) node_lost(self->state, self->state.workers[static_cast<size_t>(rank)].node());
            auto error = link_lost(e) ? died(self->state, call->method, rank)
                                      : to_exception(self->system(), self->state, e, call->method, rank);
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
    if (link_lost(dm.reason)) node_lost(st, dm.source.node());
    for (size_t r = 0; r < st.workers.size(); ++r) {
      if (st.workers[r].address() != dm.source) continue;
      // A worker's own exit (exit_worker, or its node shutting down) carries its words; a lost
      // link was said for the whole node by node_lost.
      const bool own = dm.reason.category() == caf::atom("hyflow") && !context_string(dm.reason, 1).empty();
      if (!link_lost(dm.reason) || st.death[r].empty())
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

caf::actor spawn_collector(caf::actor_system& sys, std::vector<worker_actor> workers, std::vector<std::string> names,
                           std::string job, std::shared_ptr<std::vector<std::atomic<bool>>> alive) {
  return sys.spawn<caf::detached>(collector_behavior, std::move(workers), std::move(names), std::move(job),
                                  std::move(alive));
}

}  // namespace hyflow::actors::detail
