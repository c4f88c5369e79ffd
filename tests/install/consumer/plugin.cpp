// A caf-node worker plugin built against the installed hyflow with hyflow::plugin, the recipe of
// docs/cluster.md ("Your own worker types on caf-node"): it links no hyflow library.
#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker.hpp>
#include <hyflow/actors/worker_registry.hpp>

namespace consumer {

class EchoWorker : public hyflow::Worker {
 public:
  std::string echo(const std::string& s) const { return s; }
  static void define_methods(hyflow::MethodTable<EchoWorker>& t) {
    t.add("echo", &EchoWorker::echo, {.dispatch = hyflow::Dispatch::ONE_TO_ALL});
  }
};

}  // namespace consumer

HYFLOW_REGISTER_WORKER(consumer::EchoWorker, "consumer.EchoWorker");
