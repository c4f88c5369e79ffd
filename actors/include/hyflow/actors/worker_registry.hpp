#pragma once
// Worker types by name, so that a group (and, later, a remote node) can build workers from a
// spec {type name, init args} alone: verl's ClassWithInitArgs.

#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker.hpp>

#include <functional>
#include <memory>
#include <string>
#include <typeindex>

namespace hyflow::actors {

/// A worker class and its constructor arguments.
struct WorkerSpec {
  std::string type;
  Json args = Json::object();

  Json to_json() const { return Json{{"type", type}, {"args", args}}; }
  static WorkerSpec from_json(const Json& j);
};

/// A constructed worker and the method table that serves it (per class, or per instance for
/// colocated bundles).
struct CreatedWorker {
  std::unique_ptr<Worker> worker;
  std::shared_ptr<const MethodTableBase> table;
};

using WorkerFactory = std::function<CreatedWorker(const Json& args)>;

/// Registers a factory under `name`; ValueError when the name is taken by another type.
void register_worker_factory(const std::string& name, WorkerFactory factory, std::type_index type,
                             std::shared_ptr<const MethodTableBase> table);
/// Constructs a worker of spec.type on the calling thread; KeyError listing the known types.
CreatedWorker create_worker(const WorkerSpec& spec);
bool has_worker_type(const std::string& name);
/// Every registered worker type name, sorted.
std::vector<std::string> worker_type_names();
/// The C++ type registered under `name` (typeid(void) for types without one).
std::type_index worker_type_index(const std::string& name);
/// The method table of a registered class (null for per-instance tables).
std::shared_ptr<const MethodTableBase> worker_methods(const std::string& name);

/// Registers W under `name`. W is constructed from the init args (W(const Json&)) or, when it
/// has no such constructor, default-constructed (then the args must be empty).
template <class W>
void register_worker_type(const std::string& name) {
  static_assert(std::is_base_of_v<Worker, W>, "worker types derive from hyflow::Worker");
  std::shared_ptr<const MethodTableBase> table(&MethodTable<W>::get(), [](const MethodTableBase*) {});
  register_worker_factory(
      name,
      [name, table](const Json& args) {
        CreatedWorker out;
        if constexpr (std::is_constructible_v<W, const Json&>) {
          out.worker = std::make_unique<W>(args);
        } else {
          if (!args.is_null() && !args.empty())
            throw ValueError("worker type '" + name + "' takes no init args, got " + args.dump());
          out.worker = std::make_unique<W>();
        }
        out.table = table;
        return out;
      },
      typeid(W), table);
}

}  // namespace hyflow::actors

/// Registers a worker type at static-initialization time (in an executable's own TU).
#define HYFLOW_DETAIL_CONCAT2(a, b) a##b
#define HYFLOW_DETAIL_CONCAT(a, b) HYFLOW_DETAIL_CONCAT2(a, b)
#define HYFLOW_REGISTER_WORKER(W, NAME)                                              \
  [[maybe_unused]] static const bool HYFLOW_DETAIL_CONCAT(hyflow_registered_worker_, __COUNTER__) = [] { \
    ::hyflow::register_worker_type<W>(NAME);                                         \
    return true;                                                                      \
  }()

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
using actors::register_worker_type;
using actors::WorkerSpec;
}  // namespace hyflow
