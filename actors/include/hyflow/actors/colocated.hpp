#pragma once
// Colocation (verl's WorkerDict): one worker hosting several roles, e.g. the actor role and
// the critic on one device. Each role is built from its own spec in the same thread; its
// methods are exposed as "{role}_{method}" (and DIRECT_ROLLOUT_METHOD ones also unprefixed).
// WorkerGroup::spawn({"actor_rollout", "critic"}) gives per-role views of the same workers.

#include <hyflow/actors/worker.hpp>
#include <hyflow/actors/worker_registry.hpp>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::actors {

/// Registered type name of colocated bundles.
inline constexpr const char* kColocatedWorkerType = "hyflow::Colocated";

/// The spec of a bundle of roles: {role -> spec}. Role names must be non-empty and contain
/// no '_' at the end; ValueError otherwise.
WorkerSpec colocated_spec(const std::vector<std::pair<std::string, WorkerSpec>>& roles);

/// The role -> spec map of a colocated spec (KeyError if `spec` is not one).
std::vector<std::pair<std::string, WorkerSpec>> colocated_roles(const WorkerSpec& spec);

/// The worker behind a colocated spec. Roles are constructed in declaration order.
class ColocatedWorker : public Worker {
 public:
  explicit ColocatedWorker(const Json& args);
  Worker& role(const std::string& name);
  const std::vector<std::string>& role_names() const { return order_; }

 private:
  std::vector<std::string> order_;
  std::map<std::string, std::unique_ptr<Worker>> roles_;
};

/// The table of a bundle, built from the roles' registered tables (no worker is
/// constructed): role methods with prefixes, the fused entry point and the bundle's built-ins.
std::shared_ptr<const MethodTableBase> colocated_table(const WorkerSpec& spec);

/// Name of the fused entry point: args {role, method, [args...]}.
inline constexpr const char* kFusedExecuteMethod = "fused_execute";

/// Registers the colocated type (done by Runtime; idempotent).
void register_colocated_worker_type();

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
using actors::colocated_spec;
}  // namespace hyflow
