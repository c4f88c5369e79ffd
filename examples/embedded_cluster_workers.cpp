// The worker type of examples/embedded_cluster.cpp, built twice: as a plugin for the shipped
// caf-node (a MODULE linking hyflow::plugin, loaded with --plugin) and into the application, which
// reads its method table by name. Nothing here knows about networks.
#include "embedded_cluster_workers.hpp"

#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker_registry.hpp>

#include <unistd.h>

namespace app {

TextScorer::TextScorer(const hyflow::Json& args) : scale_(args.value("scale", 1.0)) {}

double TextScorer::score(const std::string& text) const {
  return scale_ * static_cast<double>(text.size());
}

std::string TextScorer::where() const {
  return "rank " + std::to_string(rank()) + " in process " + std::to_string(::getpid());
}

void TextScorer::define_methods(hyflow::MethodTable<TextScorer>& t) {
  t.add("score", &TextScorer::score, {.dispatch = hyflow::Dispatch::ONE_TO_ALL});
  t.add("where", &TextScorer::where, {.dispatch = hyflow::Dispatch::ONE_TO_ALL});
}

}  // namespace app

HYFLOW_REGISTER_WORKER(app::TextScorer, "app.TextScorer");
