// The worker actor: it constructs its worker class on hf_init and runs one method per hf_call
// (large payloads of a remote caller travel over the PayloadTransfer), and the worker protocol's
// registration with CAF (caf_protocol.hpp).
#include "worker_actor.hpp"

#include <hyflow/actors/caf_inspect.hpp>
#include <hyflow/actors/caf_protocol.hpp>
#include <hyflow/actors/call_trace.hpp>
#include <hyflow/actors/payload_transfer.hpp>
#include <hyflow/actors/worker_host.hpp>
#include <hyflow/actors/worker_stats.hpp>

#include <caf/all.hpp>

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

namespace hyflow::actors::detail {

using caf_protocol::call_atom;
using caf_protocol::errc;
using caf_protocol::init_atom;
using caf_protocol::worker_actor;

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

bool uses_tls(caf::actor_system& sys) { return !sys.config().openssl_certificate.empty(); }

std::string context_string(const caf::error& e, size_t i) {
  const auto& ctx = e.context();
  if (ctx.size() > i && ctx.match_element<std::string>(i)) return ctx.get_as<std::string>(i);
  return {};
}

namespace {

inline caf::error make_error(errc code, std::string kind, std::string message) {
  return {static_cast<uint8_t>(code), caf::atom("hyflow"), caf::make_message(std::move(kind), std::move(message))};
}

// ---- worker actor --------------------------------------------------------------------------

/// Counts this worker in WorkerStats::alive for as long as its state lives.
struct AliveWorker {
  AliveWorker() { worker_stats().alive.fetch_add(1, std::memory_order_relaxed); }
  ~AliveWorker() { worker_stats().alive.fetch_sub(1, std::memory_order_relaxed); }
  AliveWorker(const AliveWorker&) = delete;
  AliveWorker& operator=(const AliveWorker&) = delete;
};

/// One call in WorkerStats: in flight while it lives, then ok unless marked failed.
struct CountedCall {
  bool failed = true;  ///< cleared when the method returns a result
  CountedCall() { worker_stats().calls_in_flight.fetch_add(1, std::memory_order_relaxed); }
  ~CountedCall() {
    auto& s = worker_stats();
    s.calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
    (failed ? s.calls_failed : s.calls_ok).fetch_add(1, std::memory_order_relaxed);
  }
  CountedCall(const CountedCall&) = delete;
  CountedCall& operator=(const CountedCall&) = delete;
};

struct worker_state {
  WorkerSpec spec;
  WorkerEnv env;
  std::string job;  ///< the launching controller's job id ("JOB" in the env message; empty: none)
  CreatedWorker created;
  AliveWorker alive;
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
        CountedCall counted;
        if (!st.created.worker) return make_error(errc::method_failed, "Error", "worker is not initialized");
        // The step timeline: this call's execution on this worker's track (when this process
        // records; the controller's clock, since it is this process's).
        const ThreadTrack track =
            CallTrace::active() ? ThreadTrack(CallTrace::worker_track(st.env.name, st.env.rank)) : ThreadTrack();
        TraceSpan span("execute", method);
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
          counted.failed = false;
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

}  // namespace hyflow::actors::caf_protocol

namespace hyflow::actors {

WorkerStats& worker_stats() {
  static auto* stats = new WorkerStats;
  return *stats;
}

}  // namespace hyflow::actors
