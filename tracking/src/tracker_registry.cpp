// The tracker registry: the built-ins are in the table from its construction, so registering
// and looking up never depend on the order of static initialization.
#include <hyflow/core/error.hpp>
#include <hyflow/core/named_registry.hpp>
#include <hyflow/core/suggest.hpp>
#include <hyflow/tracking/console_tracker.hpp>
#include <hyflow/tracking/jsonl_tracker.hpp>
#include <hyflow/tracking/prometheus_tracker.hpp>
#include <hyflow/tracking/tensorboard_tracker.hpp>
#include <hyflow/tracking/tracker_registry.hpp>

#include "resolve_tracker.hpp"

#include <map>

namespace hyflow::tracking {

namespace {

struct Entry {
  TrackerFactory make;
  std::string tracker;  ///< the name it stands for: itself, or an alias's target
};

std::map<std::string, Entry> builtin_trackers() {
  const TrackerFactory console = [](const RunInfo& run) { return std::make_unique<ConsoleTracker>(run); };
  const TrackerFactory jsonl = [](const RunInfo& run) { return std::make_unique<JsonlTracker>(run); };
  const TrackerFactory tensorboard = [](const RunInfo& run) { return std::make_unique<TensorBoardTracker>(run); };
  const TrackerFactory prometheus = [](const RunInfo& run) { return std::make_unique<PrometheusTracker>(run); };
  return {{"console", {console, "console"}},
          {"jsonl", {jsonl, "jsonl"}},
          {"file", {jsonl, "jsonl"}},
          {"tensorboard", {tensorboard, "tensorboard"}},
          {"prometheus", {prometheus, "prometheus"}}};
}

NamedRegistry<Entry>& registry() {
  static NamedRegistry<Entry> trackers("tracker", builtin_trackers());
  return trackers;
}

Entry entry(const std::string& name) {
  if (auto found = registry().find(name)) return *found;
  const auto known = registry().names();
  throw KeyError("unknown tracker '" + name + "' in trainer.logger" + did_you_mean(name, known) +
                 " (known: " + join_names(known) + ")");
}

}  // namespace

void register_tracker(const std::string& name, TrackerFactory factory) {
  if (!factory) throw ValueError("register_tracker: empty factory for tracker '" + name + "'");
  registry().add(name, Entry{std::move(factory), name});
}

bool has_tracker(const std::string& name) {
  return registry().contains(name);
}

std::vector<std::string> tracker_names() {
  return registry().names();
}

std::unique_ptr<Tracker> make_tracker(const std::string& name, const RunInfo& run) {
  auto tracker = entry(name).make(run);
  if (!tracker) throw ValueError("the factory of tracker '" + name + "' returned no tracker");
  return tracker;
}

std::string detail::resolve_tracker(const std::string& name) {
  return entry(name).tracker;
}

}  // namespace hyflow::tracking
