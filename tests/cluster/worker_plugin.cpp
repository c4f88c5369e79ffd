// A worker plugin for caf-node (--plugin): a shared library that links none of hyflow's
// libraries; its static initializer registers a worker type with the node's registry. The
// plugin test compiles this file into the controller as well, which needs the method table.
#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker.hpp>
#include <hyflow/actors/worker_registry.hpp>

#include <unistd.h>

#include <string>

namespace plugin_test {

class PluginWorker : public hyflow::Worker {
 public:
  explicit PluginWorker(const hyflow::Json& args) : greeting_(args.value("greeting", std::string("hello"))) {}
  std::string greet(const std::string& who) const {
    return greeting_ + " " + who + " from rank " + std::to_string(rank());
  }
  int64_t process_id() const { return static_cast<int64_t>(::getpid()); }
  static void define_methods(hyflow::MethodTable<PluginWorker>& t) {
    t.add("greet", &PluginWorker::greet, {.dispatch = hyflow::Dispatch::ONE_TO_ALL});
    t.add("process_id", &PluginWorker::process_id, {.dispatch = hyflow::Dispatch::RANK_ZERO});
  }

 private:
  std::string greeting_;
};

}  // namespace plugin_test

HYFLOW_REGISTER_WORKER(plugin_test::PluginWorker, "PluginWorker");
