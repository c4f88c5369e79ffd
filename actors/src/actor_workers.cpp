// Own CAF actors as workers (actor_workers.hpp): the per-process registry of their worker types,
// the adapter actor that speaks the worker protocol for one rank's actor, and the launcher.
#include <hyflow/actors/actor_workers.hpp>

#include <mutex>

namespace hyflow::actors::detail {

namespace {
using caf_protocol::call_atom;
using caf_protocol::errc;
using caf_protocol::init_atom;

bool same_declarations(const MethodTableBase& table, const std::vector<MethodEntry>& entries) {
  if (table.entries().size() != entries.size()) return false;
  for (const auto& e : entries) {
    const MethodEntry* r = table.find(e.name);
    if (!r || r->parameter_types != e.parameter_types || r->result_type != e.result_type ||
        r->pointer_type != e.pointer_type || r->options.dispatch != e.options.dispatch ||
        r->options.execute != e.options.execute || r->options.blocking != e.options.blocking ||
        r->options.materialize_futures != e.options.materialize_futures ||
        r->options.inline_dispatch != e.options.inline_dispatch)
      return false;
  }
  return true;
}

/// One rank: forwards the worker protocol's calls to the application's actor `target`.
caf::behavior adapter(caf::event_based_actor* self, caf::actor target, std::shared_ptr<const ActorMethods> methods,
                      std::string worker_name, std::string type) {
  self->link_to(target);  // the group's exit ends the actor; the actor's failure ends this adapter
  self->monitor(target);  // and so does its normal end
  self->set_down_handler([self](caf::down_msg& dm) {
    self->quit(
        caf::error(static_cast<uint8_t>(errc::worker_exit), caf::atom("hyflow"),
                   caf::make_message(std::string("exit"), "its actor ended (" + caf::to_string(dm.reason) + ")")));
  });
  return {
      [worker_name](init_atom, const std::string&, const std::string&) { return worker_name; },
      [=](call_atom, const std::string& method, std::vector<Value>& args) {
        auto promise = self->make_response_promise();
        auto it = methods->find(method);
        if (it == methods->end())
          promise.deliver(actor_method_error(std::make_exception_ptr(
              BindError("actor worker type '" + type + "' has no method '" + method + "'", method))));
        else
          it->second(self, target, args, promise);
        return promise;
      },
  };
}

class ActorLauncher : public WorkerLauncher {
 public:
  ActorLauncher(caf::actor_system& system, std::string type,
                std::function<caf::actor(caf::actor_system&, const WorkerEnv&)> factory,
                std::shared_ptr<const ActorMethods> methods)
      : system_(system), type_(std::move(type)), factory_(std::move(factory)), methods_(std::move(methods)) {}

  std::vector<WorkerRef> launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) override {
    if (spec.type != type_)
      throw ValueError("the launcher of actor workers '" + type_ + "' cannot place workers of type '" + spec.type +
                       "'");
    if (!spec.args.is_null() && !spec.args.empty())
      throw ValueError("actor worker type '" + type_ +
                       "' takes no init args (the factory captures its settings), got " + spec.args.dump());
    std::vector<caf::actor> adapters;
    std::vector<WorkerRef> out;
    for (size_t i = 0; i < envs.size(); ++i) {
      caf::actor target;
      std::string failure;
      try {
        target = factory_(system_, envs[i]);
        if (!target) failure = "the factory returned no actor";
      } catch (const std::exception& e) {
        failure = e.what();
      }
      if (!failure.empty()) {
        for (auto& a : adapters) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
        throw CallError("__init__", static_cast<int>(i), failure,
                        "constructing actor worker type '" + type_ + "' failed on rank " + std::to_string(i) + " of " +
                            std::to_string(envs.size()) + ": " + failure);
      }
      adapters.push_back(system_.spawn(adapter, target, methods_, envs[i].name, type_));
      out.push_back(
          caf_protocol::make_worker_ref(caf::actor_cast<caf_protocol::worker_actor>(adapters.back()), spec, envs[i]));
    }
    return out;
  }

 private:
  caf::actor_system& system_;
  std::string type_;
  std::function<caf::actor(caf::actor_system&, const WorkerEnv&)> factory_;
  std::shared_ptr<const ActorMethods> methods_;
};
}  // namespace

caf::error actor_method_error(std::exception_ptr error) {
  return to_caf_error(std::move(error));
}

std::shared_ptr<const MethodTableBase> register_actor_worker_type(const std::string& type,
                                                                  const std::vector<MethodEntry>& entries) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const MethodTableBase>> tables;
  std::lock_guard lock(mutex);
  if (auto it = tables.find(type); it != tables.end()) {
    if (!same_declarations(*it->second, entries))
      throw ValueError("actor worker type '" + type +
                       "' is already registered in this process with other methods (one set of declarations per name)");
    return it->second;
  }
  if (entries.empty()) throw ValueError("actor worker type '" + type + "' declares no method");
  auto table = std::make_shared<MethodTableBase>();
  for (const auto& e : entries) table->insert(e);
  register_worker_factory(
      type,
      [type](const Json&) -> CreatedWorker {
        throw NotSupportedError("worker type '" + type +
                                "' runs as actors of the application: create its groups with its ActorWorkers "
                                "(make_group, or WorkerGroupOptions{.launcher = workers.launcher()})");
      },
      typeid(void), table);  // ValueError when a worker class has the name
  tables.emplace(type, table);
  return table;
}

std::shared_ptr<WorkerLauncher> make_actor_launcher(
    caf::actor_system& system, std::string type,
    std::function<caf::actor(caf::actor_system&, const WorkerEnv&)> factory,
    std::shared_ptr<const ActorMethods> methods) {
  return std::make_shared<ActorLauncher>(system, std::move(type), std::move(factory), std::move(methods));
}

}  // namespace hyflow::actors::detail

namespace hyflow::actors {

std::shared_ptr<WorkerLauncher> ActorWorkers::launcher() {
  if (!launcher_) {
    detail::register_actor_worker_type(type_, entries_);
    launcher_ = detail::make_actor_launcher(*system_, type_, factory_, methods_);
  }
  return launcher_;
}

WorkerGroup ActorWorkers::make_group(const ResourcePool& pool, WorkerGroupOptions options) {
  options.launcher = launcher();
  return WorkerGroup(*runtime_, pool, spec(), std::move(options));
}

}  // namespace hyflow::actors
