// A group's Transport on CAF: resolves the group's worker actors, spawns its collector and
// hands it the calls; stopping ends the collector and, for a group that owns them, the workers.
#include "caf_transport.hpp"

#include "call_collector.hpp"
#include "worker_actor.hpp"

#include <hyflow/actors/caf_inspect.hpp>
#include <hyflow/actors/caf_protocol.hpp>

#include <caf/all.hpp>

namespace hyflow::actors::detail {

using caf_protocol::worker_actor;

namespace {

worker_actor actor_of(const WorkerRef& w) {
  auto* h = dynamic_cast<CafWorkerHandle*>(w.get());
  if (!h) throw ValueError("worker '" + w->env().name + "' was not launched by this runtime");
  auto a = h->actor();
  if (!a) throw RuntimeStoppedError("worker '" + w->env().name + "'");
  return a;
}

}  // namespace

CafTransport::CafTransport(std::shared_ptr<RuntimeCore> core, std::vector<WorkerRef> workers, bool owns)
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
  collector_ = spawn_collector(sys, std::move(actors), std::move(names), std::move(job), alive_);
  core_->live->track(caf::actor_cast<caf::abstract_actor*>(collector_));
}

CafTransport::~CafTransport() { stop(); }

void CafTransport::submit(std::shared_ptr<PendingCall> call) {
  std::lock_guard lock(mutex_);
  if (!collector_) throw RuntimeStoppedError(call->method);
  caf::anon_send(collector_, submit_atom::value, std::move(call));
}

void CafTransport::kill(int rank) {
  std::lock_guard lock(mutex_);
  if (collector_) caf::anon_send(collector_, kill_atom::value, rank);
}

void CafTransport::stop() {
  std::lock_guard lock(mutex_);
  if (!collector_) return;
  caf::anon_send_exit(collector_, caf::exit_reason::user_shutdown);
  collector_ = nullptr;
  if (owns_)
    for (auto& w : workers_)
      if (auto a = static_cast<CafWorkerHandle&>(*w).actor()) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

}  // namespace hyflow::actors::detail
