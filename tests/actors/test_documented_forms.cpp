// The forms docs/embedding.md and docs/runtime.md show, written as a user writes them. This file
// is compiled with -Wextra -Werror (tests/actors/CMakeLists.txt): designated initializers that
// leave members out must not warn (-Wmissing-field-initializers), and the short hyflow:: names
// the docs use must exist. Also: the structured context of an unknown-method error.
#include <hyflow/actors/all.hpp>
#include <hyflow/actors/group_actor.hpp>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>

using namespace std::chrono_literals;

namespace {

class FormsWorker : public hyflow::Worker {
 public:
  explicit FormsWorker(const hyflow::Json&) {}
  int add_rank(int x) { return x + rank(); }
  hyflow::DataProto same(hyflow::DataProto batch) { return batch; }
  static void define_methods(hyflow::MethodTable<FormsWorker>& t) {
    t.add("add_rank", &FormsWorker::add_rank, {.dispatch = hyflow::Dispatch::ONE_TO_ALL});
    t.add("same", &FormsWorker::same, {.dispatch = hyflow::Dispatch::DP_COMPUTE_PROTO, .blocking = true});
  }
};

struct FormsConfig : caf::actor_system_config {
  FormsConfig() { hyflow::Runtime::register_types(*this); }
};

}  // namespace

TEST_CASE("the documented designated initializers compile warning-free under -Wextra") {
  hyflow::register_worker_type<FormsWorker>("FormsWorker");
  hyflow::Runtime runtime(hyflow::RuntimeOptions{.scheduler_threads = 2});
  hyflow::WorkerGroup wg(runtime, hyflow::ResourcePool({2}), {"FormsWorker", {{"lr", 0.5}}},
                         hyflow::WorkerGroupOptions{.launcher = runtime.in_process_launcher()});
  hyflow::WorkerGroup named(runtime, hyflow::ResourcePool({1}), {"FormsWorker", hyflow::Json::object()},
                            {.name_prefix = "forms_", .call_deadline = 30s});
  CHECK(named.worker_names().front().rfind("forms_", 0) == 0);
  hyflow::Value v = wg.call(hyflow::CallOptions{.blocking = false}, "add_rank", 1);
  REQUIRE(v.is_value_future());
  CHECK(hyflow::from_value<std::vector<int>>(v.materialized(), "add_rank") == std::vector<int>{1, 2});
  std::vector<int> ranks = wg.call(hyflow::CallOptions{.deadline = 30s}, &FormsWorker::add_rank, 10);
  CHECK(ranks == std::vector<int>{10, 11});
  const hyflow::MethodOptions inline_pair{.inline_dispatch =
                                              hyflow::actors::dispatch_mode(hyflow::Dispatch::ONE_TO_ALL)};
  CHECK(inline_pair.dispatch == hyflow::Dispatch::ALL_TO_ALL);  // the others keep their defaults
}

TEST_CASE("hyflow::BindError and hyflow::NotSupportedError name the errors the docs name") {
  hyflow::register_worker_type<FormsWorker>("FormsWorker");
  hyflow::Runtime runtime;
  hyflow::WorkerGroup wg(runtime, hyflow::ResourcePool({2}), {"FormsWorker", hyflow::Json::object()});
  CHECK_THROWS_AS(wg.call("no_such_method"), hyflow::BindError);
  try {
    wg.call("add_rank", 1, 2);
    FAIL("a wrong argument count must throw");
  } catch (const hyflow::BindError& e) {
    CHECK(e.method() == "add_rank");
    CHECK(e.rank() == -1);  // refused before any rank was asked
  }
}

TEST_CASE("an unknown method's caf::error carries the method in its structured context") {
  hyflow::register_worker_type<FormsWorker>("FormsWorker");
  FormsConfig cfg;
  caf::actor_system app{cfg};
  hyflow::Runtime runtime(app);
  hyflow::WorkerGroup wg(runtime, hyflow::ResourcePool({2}), {"FormsWorker", hyflow::Json::object()});
  caf::scoped_actor self{app};
  caf::error error;
  hyflow::request(self.ptr(), wg, 10s, "no_such_method", 1)
      .receive([](hyflow::Value) {}, [&](caf::error& e) { error = e; });
  REQUIRE(error);
  CHECK(hyflow::error_kind(error) == "BindError");
  CHECK_THAT(hyflow::error_message(error), Catch::Contains("no method 'no_such_method'"));
  REQUIRE(error.context().match_elements<std::string, std::string, std::string, int32_t>());
  CHECK(error.context().get_as<std::string>(2) == "no_such_method");
  CHECK(error.context().get_as<int32_t>(3) == -1);
}
