#include <hyflow/core/named_registry.hpp>
#include <hyflow/rollout/rollout_registry.hpp>

#include "decode_rollout.hpp"
#include "server_rollout_backend.hpp"

namespace hyflow::rollout {
namespace {

NamedRegistry<RolloutFactory>& backends() {
  // the built-ins are in the table from its construction: no static-initialization order
  static NamedRegistry<RolloutFactory> registry(
      "rollout backend (actor_rollout_ref.rollout.name)",
      {{"hf", detail::make_decode_rollout}, {"server", detail::make_server_rollout}});
  return registry;
}

}  // namespace

void register_rollout_backend(const std::string& name, RolloutFactory factory) {
  if (name.empty()) throw ValueError("register_rollout_backend: the name is empty");
  backends().put(name, std::move(factory), /*overwrite=*/true);
}

bool has_rollout_backend(const std::string& name) {
  return backends().contains(name);
}

std::vector<std::string> rollout_backend_names() {
  return backends().names();
}

std::unique_ptr<RolloutBackend> make_rollout_backend(const std::string& name, const RolloutContext& context) {
  auto backend = backends().get(name)(context);
  if (!backend) throw ValueError("rollout backend '" + name + "': its factory returned nothing");
  return backend;
}

}  // namespace hyflow::rollout
