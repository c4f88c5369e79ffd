#pragma once
// Tool plugins: shared libraries whose static initializers call register_tool (or
// register_interaction), loaded by path like reward plugins (core's load_shared_library). The
// program that loads them exports its symbols (ENABLE_EXPORTS) and the plugin links none of
// hyflow's libraries, so both share one registry. Config key (read by the multi_turn section):
// actor_rollout_ref.rollout.multi_turn.tool_plugins, a list of paths. Guide: docs/agents-tools.md.

#include <string>
#include <vector>

namespace hyflow::agents {

/// Loads each library for the life of the process, in order. ValueError naming the path and the
/// loader's reason (a missing file, an unresolved symbol) for the first that fails.
void load_tool_plugins(const std::vector<std::string>& paths);

}  // namespace hyflow::agents
