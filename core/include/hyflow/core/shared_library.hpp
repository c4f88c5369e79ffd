#pragma once
// Loading plugins: shared libraries whose static initializers register something with hyflow
// (reward functions, worker types). The host program exports its symbols (ENABLE_EXPORTS) and
// the plugin links none of hyflow's libraries, so both share one registry.

#include <string>

namespace hyflow {

/// dlopen()s `path` for the life of the process (RTLD_NOW | RTLD_GLOBAL: an unresolved symbol
/// fails here, not at first use; what the library registered points into it, so it is never
/// closed). ValueError naming `what` ("worker plugin"), the path and the loader's reason.
void load_shared_library(const std::string& path, const std::string& what);

}  // namespace hyflow
