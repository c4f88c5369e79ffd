#pragma once
// The trackers trainer.logger can name, keyed by name: the built-ins "console", "jsonl", its
// verl alias "file", and "tensorboard", plus any registered by a program or plugin with one
// register_tracker call (docs/tracking.md, "How to add a tracker").

#include <hyflow/tracking/run_info.hpp>
#include <hyflow/tracking/tracker.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::tracking {

/// Creates a tracker for one run.
using TrackerFactory = std::function<std::unique_ptr<Tracker>(const RunInfo&)>;

/// Adds a tracker under a new name; ValueError when the name is taken or the factory is empty.
void register_tracker(const std::string& name, TrackerFactory factory);
bool has_tracker(const std::string& name);
/// Registered names in sorted order.
std::vector<std::string> tracker_names();
/// A new tracker of that name for the run. KeyError for an unknown name: "unknown tracker 'x'
/// in trainer.logger; did you mean 'y'? (known: console, file, jsonl, tensorboard)".
std::unique_ptr<Tracker> make_tracker(const std::string& name, const RunInfo& run);

}  // namespace hyflow::tracking
