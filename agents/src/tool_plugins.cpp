#include <hyflow/agents/tool_plugins.hpp>
#include <hyflow/core/shared_library.hpp>

namespace hyflow::agents {

void load_tool_plugins(const std::vector<std::string>& paths) {
  for (const auto& path : paths) load_shared_library(path, "tool plugin");
}

}  // namespace hyflow::agents
