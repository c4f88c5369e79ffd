#pragma once
// Small socket helpers shared by the runtime (a worker group's MASTER_PORT) and the process
// groups.

#include <string>

namespace hyflow {

/// A TCP port that was free on `addr` a moment ago (bind to port 0, read it, close).
/// ValueError for an address that is not IPv4; Error when no socket can be bound.
int pick_free_port(const std::string& addr = "127.0.0.1");

}  // namespace hyflow
