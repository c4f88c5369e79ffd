#pragma once
// A worker type of the application (examples/embedded_cluster.cpp): hosted by caf-node through
// --plugin, called by the application's actors.
#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker.hpp>

#include <string>

namespace app {

class TextScorer : public hyflow::Worker {
 public:
  explicit TextScorer(const hyflow::Json& args);
  /// The text's length times the init arg "scale" (every rank answers: ONE_TO_ALL).
  double score(const std::string& text) const;
  /// "rank R in process PID": where the worker runs.
  std::string where() const;
  static void define_methods(hyflow::MethodTable<TextScorer>& t);

 private:
  double scale_;
};

}  // namespace app
