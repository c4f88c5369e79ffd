#pragma once
// Module-internal: the tracker a registered name stands for, so that Tracking can refuse a
// tracker listed twice under two names.

#include <string>

namespace hyflow::tracking::detail {

/// "file" -> "jsonl" (verl's alias); any other registered name -> itself. KeyError for an
/// unknown name, as make_tracker.
std::string resolve_tracker(const std::string& name);

}  // namespace hyflow::tracking::detail
