// The call pipeline: dispatch -> execute -> await or future -> collect -> un-pad. Plain C++;
// the transport (CAF) only carries per-rank calls and reports answers and failures.
#include <hyflow/actors/call_trace.hpp>
#include <hyflow/actors/colocated.hpp>
#include <hyflow/actors/worker_group.hpp>
#include <hyflow/core/net.hpp>

#include <iostream>
#include <random>

namespace hyflow::actors {

namespace detail {

/// What every view of one set of workers shares.
struct GroupCore {
  std::shared_ptr<Transport> transport;
  WorkerSpec spec;
  std::vector<std::string> names;
  std::string master_addr;
  int master_port = 0;
  WorkerGroupOptions options;
  int world_size() const { return static_cast<int>(names.size()); }
};

/// One view: the whole group, or one role of a colocated bundle.
struct GroupView : DispatchContext, std::enable_shared_from_this<GroupView> {
  std::shared_ptr<GroupCore> core;
  std::string type;
  std::string prefix;      ///< "critic_" for a spawned view
  std::string fused_role;  ///< set for fused views
  std::shared_ptr<const MethodTableBase> table;
  std::mutex mutex;
  std::map<std::string, std::vector<int64_t>> dispatch_cache;
  std::map<std::string, std::vector<bool>> collect_cache;
  CallTiming timing;

  int world_size() const override { return core->world_size(); }

  const std::vector<int64_t>& dispatch_info(const std::string& mesh) override {
    {
      std::lock_guard lock(mutex);
      if (auto it = dispatch_cache.find(mesh); it != dispatch_cache.end()) return it->second;
    }
    auto ranks = from_value<std::vector<int64_t>>(call("query_dispatch_info", {Value(Json(mesh))}, {}),
                                                  "dispatch info of mesh '" + mesh + "'");
    std::lock_guard lock(mutex);
    return dispatch_cache.emplace(mesh, std::move(ranks)).first->second;
  }

  const std::vector<bool>& collect_info(const std::string& mesh) override {
    {
      std::lock_guard lock(mutex);
      if (auto it = collect_cache.find(mesh); it != collect_cache.end()) return it->second;
    }
    auto flags = from_value<std::vector<bool>>(call("query_collect_info", {Value(Json(mesh))}, {}),
                                               "collect info of mesh '" + mesh + "'");
    std::lock_guard lock(mutex);
    return collect_cache.emplace(mesh, std::move(flags)).first->second;
  }

  /// A dispatched call, ready to submit.
  struct Prepared {
    std::shared_ptr<PendingCall> pending;
    std::shared_ptr<const DispatchFns> fns;
    std::shared_ptr<const ExecuteMode> exec;
    std::shared_ptr<std::atomic<int64_t>> padding;
    bool blocking = true;
    bool returns_dataproto = false;
    double dispatch_us = 0;
  };
  Prepared prepare(const std::string& method, std::vector<Value> args, const CallOptions& options);
  Value call(const std::string& method, std::vector<Value> args, const CallOptions& options);
  void call_then(const std::string& method, std::vector<Value> args, std::function<void(Value)> on_value,
                 std::function<void(std::exception_ptr)> on_error, const CallOptions& options);
};

namespace {
using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

std::string signature(const MethodEntry& e) {
  std::string s = e.name + "(";
  for (size_t i = 0; i < e.parameter_types.size(); ++i) s += (i ? ", " : "") + e.parameter_types[i];
  return s + ") -> " + e.result_type;
}

/// Collect, pick the single result, un-pad: the tail of the pipeline.
Value finish(DispatchContext& ctx, const DispatchFns& fns, const ExecuteMode& exec, std::vector<Value> outputs,
             int64_t padding) {
  Value result = exec.single_result ? std::move(outputs.front()) : fns.collect(ctx, std::move(outputs));
  if (padding > 0 && result.is_dataproto()) result = Value(unpad_dataproto(result.dataproto(), padding));
  return result;
}
}  // namespace

GroupView::Prepared GroupView::prepare(const std::string& method, std::vector<Value> args,
                                       const CallOptions& options) {
  const auto t0 = Clock::now();
  const MethodEntry& entry = table->at(method, type);
  if (args.size() != entry.arity)
    throw BindError("method '" + method + "' of worker type '" + type + "' takes " + std::to_string(entry.arity) +
                        " argument(s), " + signature(entry) + ", got " + std::to_string(args.size()),
                    method);
  std::shared_ptr<const DispatchFns> fns =
      entry.options.inline_dispatch ? entry.options.inline_dispatch : dispatch_mode(entry.options.dispatch);
  if (!entry.options.inline_dispatch && entry.options.dispatch == Dispatch::DIRECT_ROLLOUT_METHOD)
    throw NotSupportedError("method '" + method +
                            "' is a DIRECT_ROLLOUT_METHOD: it cannot be called through a WorkerGroup");
  auto exec = execute_mode(entry.options.execute);
  // Generic futures are materialized here; DataProtoFutures travel to the workers.
  for (auto& a : args)
    if (a.is_value_future()) a = a.materialized();

  Dispatched dispatched = fns->dispatch(*this, std::move(args));
  const int ws = world_size();
  if (static_cast<int>(dispatched.per_rank.size()) != ws)
    throw ShapeError("dispatch of '" + method + "' produced " + std::to_string(dispatched.per_rank.size()) +
                     " argument lists for world size " + std::to_string(ws));
  std::vector<int> ranks = exec->ranks(ws);
  std::vector<std::vector<Value>> per_rank;
  per_rank.reserve(ranks.size());
  for (int r : ranks) {
    if (r < 0 || r >= ws)
      throw ShapeError("execute mode '" + entry.options.execute + "' picked rank " + std::to_string(r) +
                       " outside world size " + std::to_string(ws));
    auto& a = dispatched.per_rank[static_cast<size_t>(r)];
    if (!fused_role.empty()) {
      per_rank.push_back({Value(Json(fused_role)), Value(Json(method)), Value(std::move(a))});
    } else {
      per_rank.push_back(std::move(a));
    }
  }
  const std::string wire_name = fused_role.empty() ? prefix + method : std::string(kFusedExecuteMethod);
  Prepared p;
  p.pending = std::make_shared<PendingCall>(wire_name, ranks, std::move(per_rank), ws);
  auto deadline = options.deadline ? options.deadline : core->options.call_deadline;
  if (deadline) p.pending->deadline = p.pending->start + *deadline;
  p.pending->on_deadline = core->options.on_deadline;
  p.fns = std::move(fns);
  p.exec = std::move(exec);
  p.padding = dispatched.padding;
  p.blocking = options.blocking.value_or(entry.options.blocking);
  p.returns_dataproto = p.fns->collects_dataproto || (p.exec->single_result && entry.returns_dataproto);
  p.dispatch_us = us_since(t0);
  return p;
}

// The step timeline (call_trace.hpp): the call, its dispatch (split, pad, submit to the transport)
// and its collect (wait for every rank, concat, un-pad) on the caller's track.
Value GroupView::call(const std::string& method, std::vector<Value> args, const CallOptions& options) {
  TraceSpan whole("call", method);
  TraceSpan dispatch("dispatch", method, " dispatch");
  Prepared p = prepare(method, std::move(args), options);
  auto fns = p.fns;
  auto exec = p.exec;
  auto padding = p.padding;
  if (!p.blocking) {
    // The result is collected when the last rank answers (on the transport's thread).
    if (p.returns_dataproto) {
      DataProtoPromise promise;
      p.pending->on_complete = [self = shared_from_this(), fns, exec, padding, promise](PendingCall& c) {
        TraceSpan collect("collect", c.method, " collect");
        try {
          promise.set_value(finish(*self, *fns, *exec, c.take_outputs(), padding->load()).dataproto());
        } catch (...) {
          promise.set_exception(std::current_exception());
        }
      };
      core->transport->submit(p.pending);
      return Value(promise.get_future());
    }
    ValuePromise promise;
    p.pending->on_complete = [self = shared_from_this(), fns, exec, padding, promise](PendingCall& c) {
      TraceSpan collect("collect", c.method, " collect");
      try {
        promise.set_value(finish(*self, *fns, *exec, c.take_outputs(), padding->load()));
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    };
    core->transport->submit(p.pending);
    return Value(promise.get_future());
  }

  if (PendingCall::in_completion())
    throw NotSupportedError("blocking call of '" + method +
                            "' from a call's continuation: it would wait for the thread it runs on (the group's "
                            "collector); make it non-blocking (CallOptions{.blocking = false}) or use call_then");
  const auto t1 = Clock::now();
  core->transport->submit(p.pending);
  dispatch.end();
  TraceSpan collect("collect", method, " collect");
  p.pending->wait();
  const double execute_us = us_since(t1);
  const auto t2 = Clock::now();
  Value result = finish(*this, *fns, *exec, p.pending->take_outputs(), padding->load());
  std::lock_guard lock(mutex);
  timing = CallTiming{method, p.dispatch_us, execute_us, us_since(t2), us_since(p.pending->start),
                      p.pending->answer_us()};
  return result;
}

void GroupView::call_then(const std::string& method, std::vector<Value> args, std::function<void(Value)> on_value,
                          std::function<void(std::exception_ptr)> on_error, const CallOptions& options) {
  if (!on_value || !on_error) throw ValueError("call_then of '" + method + "': empty handler");
  TraceSpan dispatch("dispatch", method, " dispatch");
  Prepared p = prepare(method, std::move(args), options);
  p.pending->on_complete = [self = shared_from_this(), fns = p.fns, exec = p.exec, padding = p.padding,
                            on_value = std::move(on_value), on_error = std::move(on_error)](PendingCall& c) {
    std::exception_ptr error;
    Value result;
    TraceSpan collect("collect", c.method, " collect");
    try {
      result = finish(*self, *fns, *exec, c.take_outputs(), padding->load());
    } catch (...) {
      error = std::current_exception();
    }
    collect.end();
    try {
      if (error) on_error(error);
      else on_value(std::move(result));
    } catch (const std::exception& e) {
      std::cerr << "hyflow: a call_then handler of '" << c.method << "' threw (ignored): " << e.what() << std::endl;
    } catch (...) {
      std::cerr << "hyflow: a call_then handler of '" << c.method << "' threw (ignored)" << std::endl;
    }
  };
  core->transport->submit(p.pending);
}

}  // namespace detail

namespace {
/// 256 random bits in hex: the secret of one group's rendezvous store (WorkerEnv::store_token).
std::string random_store_token() {
  std::random_device device;  // the kernel's generator (getrandom), not a seeded engine
  std::string hex;
  static constexpr char kDigits[] = "0123456789abcdef";
  for (int i = 0; i < 8; ++i) {
    const uint32_t word = device();
    for (int shift = 28; shift >= 0; shift -= 4) hex += kDigits[(word >> shift) & 0xf];
  }
  return hex;
}

std::shared_ptr<const MethodTableBase> table_for(const WorkerSpec& spec) {
  return spec.type == kColocatedWorkerType ? colocated_table(spec) : worker_methods(spec.type);
}
}  // namespace

WorkerGroup::WorkerGroup(std::shared_ptr<detail::GroupView> view) : view_(std::move(view)) {}

WorkerGroup::WorkerGroup(Runtime& runtime, const ResourcePool& pool, WorkerSpec spec, WorkerGroupOptions options) {
  auto table = table_for(spec);  // an unknown type fails here, before anything is launched
  auto core = std::make_shared<detail::GroupCore>();
  core->spec = spec;
  core->options = options;
  core->master_addr = "127.0.0.1";
  core->master_port = pick_free_port(core->master_addr);
  auto envs = pool.place(options.name_prefix, spec.type == kColocatedWorkerType ? "Colocated" : spec.type,
                         core->master_addr, core->master_port);
  const std::string store_token = random_store_token();
  for (auto& e : envs) e.store_token = store_token;
  auto workers = (options.launcher ? *options.launcher : runtime.launcher()).launch(spec, envs);
  for (const auto& w : workers) core->names.push_back(w->env().name);
  if (options.detached) runtime.keep_detached(workers);
  core->transport = runtime.connect(std::move(workers), !options.detached);
  view_ = std::make_shared<detail::GroupView>();
  view_->core = core;
  view_->type = spec.type;
  view_->table = std::move(table);
}

WorkerGroup WorkerGroup::from_detached(Runtime& runtime, const std::vector<std::string>& worker_names,
                                       WorkerGroupOptions options) {
  if (worker_names.empty()) throw ValueError("from_detached: no worker names");
  std::vector<WorkerRef> workers;
  for (const auto& n : worker_names) workers.push_back(runtime.find_detached(n));
  const auto& spec = workers.front()->spec();
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i]->spec().type != spec.type)
      throw ValueError("from_detached: worker '" + worker_names[i] + "' is a '" + workers[i]->spec().type +
                       "', the first is a '" + spec.type + "'");
    if (workers[i]->env().rank != static_cast<int>(i) ||
        workers[i]->env().world_size != static_cast<int>(workers.size()))
      throw ValueError("from_detached: worker '" + worker_names[i] + "' is rank " +
                       std::to_string(workers[i]->env().rank) + " of " + std::to_string(workers[i]->env().world_size) +
                       ", given as rank " + std::to_string(i) + " of " + std::to_string(workers.size()));
  }
  auto core = std::make_shared<detail::GroupCore>();
  core->spec = spec;
  core->options = options;
  core->master_addr = workers.front()->env().master_addr;
  core->master_port = workers.front()->env().master_port;
  core->names = worker_names;
  core->transport = runtime.connect(std::move(workers), /*owns_workers=*/false);
  auto view = std::make_shared<detail::GroupView>();
  view->core = core;
  view->type = spec.type;
  view->table = table_for(spec);
  return WorkerGroup(std::move(view));
}

WorkerGroup::~WorkerGroup() = default;

int WorkerGroup::world_size() const { return view_->world_size(); }
const std::string& WorkerGroup::worker_type() const { return view_->type; }
const MethodTableBase& WorkerGroup::methods() const { return *view_->table; }
std::vector<std::string> WorkerGroup::worker_names() const { return view_->core->names; }
const std::string& WorkerGroup::master_address() const { return view_->core->master_addr; }
int WorkerGroup::master_port() const { return view_->core->master_port; }

Value WorkerGroup::call_values(const std::string& method, std::vector<Value> args, const CallOptions& options) {
  return view_->call(method, std::move(args), options);
}

void WorkerGroup::call_then(const std::string& method, std::vector<Value> args, std::function<void(Value)> on_value,
                            std::function<void(std::exception_ptr)> on_error, const CallOptions& options) const {
  view_->call_then(method, std::move(args), std::move(on_value), std::move(on_error), options);
}

CallTiming WorkerGroup::last_timing() const {
  std::lock_guard lock(view_->mutex);
  return view_->timing;
}

std::map<std::string, WorkerGroup> WorkerGroup::spawn(const std::vector<std::string>& roles, bool fused) const {
  const auto bundle = colocated_roles(view_->core->spec);
  std::map<std::string, WorkerGroup> out;
  for (const auto& role : roles) {
    auto it = std::find_if(bundle.begin(), bundle.end(), [&](const auto& p) { return p.first == role; });
    if (it == bundle.end()) throw KeyError("spawn: the bundle has no role '" + role + "'");
    auto view = std::make_shared<detail::GroupView>();
    view->core = view_->core;
    view->type = it->second.type;
    view->prefix = role + "_";
    if (fused) view->fused_role = role;
    view->table = worker_methods(it->second.type);
    if (!view->table) throw KeyError("spawn: role '" + role + "' has no method table");
    out.emplace(role, WorkerGroup(std::move(view)));
  }
  return out;
}

void WorkerGroup::kill_worker(int rank) {
  if (rank < 0 || rank >= world_size())
    throw ValueError("kill_worker: rank " + std::to_string(rank) + " outside world size " +
                     std::to_string(world_size()));
  view_->core->transport->kill(rank);
}

bool WorkerGroup::alive(int rank) const { return view_->core->transport->alive(rank); }

}  // namespace hyflow::actors
