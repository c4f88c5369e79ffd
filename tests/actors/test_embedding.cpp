// hyflow inside another CAF application: a Runtime on the application's actor system, group
// handles held by the application's own actors, asynchronous calls from event-based actors,
// and a shutdown that is well defined whichever side goes first.
#include "test_workers.hpp"

#include <hyflow/actors/group_actor.hpp>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

using namespace hyflow;
using namespace hyflow::actors;
using test::EchoWorker;
using test::make_batch;
using namespace std::chrono_literals;

namespace {
/// A worker whose method waits for the test to open a gate: "the call is still running" without
/// timing anything.
std::promise<void> gate;
std::shared_future<void> gate_open;

class GateWorker : public Worker {
 public:
  int wait_gate(int x) {
    gate_open.wait();
    return x + rank();
  }
  DataProto twice(DataProto batch) { return DataProto(TensorDict{{"x", batch.batch.at("x") * 2}}); }
  int fail_plainly(int) { throw std::runtime_error("plain failure"); }
  static void define_methods(MethodTable<GateWorker>& t) {
    t.add("wait_gate", &GateWorker::wait_gate, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("twice", &GateWorker::twice, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
    t.add("fail_plainly", &GateWorker::fail_plainly, {.dispatch = Dispatch::ONE_TO_ALL});
  }
};

void close_gate() {
  gate = std::promise<void>();
  gate_open = gate.get_future().share();
}

struct AppConfig : caf::actor_system_config {
  AppConfig() {
    Runtime::register_types(*this);  // the one thing an embedding application adds
    set("scheduler.max-threads", size_t{2});
  }
};

using drop_atom = caf::atom_constant<caf::atom("drop")>;
using start_atom = caf::atom_constant<caf::atom("start")>;

struct holder_state {
  std::optional<WorkerGroup> group;
  Value pending;
};

/// An application actor that keeps a copy of a group and a call in flight (rank 0 sleeps
/// `ms`) until told to drop both; it answers with what became of the call.
caf::behavior holder(caf::stateful_actor<holder_state>* self, WorkerGroup group, int ms) {
  self->state.group.emplace(std::move(group));
  return {[=](start_atom) { self->state.pending = self->state.group->call("sleep_async", 0, ms); },
          [=](drop_atom) -> std::string {
            std::string outcome = "pending";
            if (self->state.pending.value_future().wait_for(0ms)) {
              try {
                self->state.pending.materialized();
                outcome = "answered";
              } catch (const std::exception& e) {
                outcome = e.what();
              }
            }
            self->quit();
            return outcome;
          }};
}
}  // namespace

TEST_CASE("a group held by an application actor outliving a private Runtime: no hang, the call fails clearly") {
  test::register_test_workers();
  for (int run = 0; run < 20; ++run) {
    CAPTURE(run);
    caf::actor_system_config cfg;
    caf::actor_system app{cfg};
    caf::actor keeper;
    {
      Runtime runtime;
      WorkerGroup wg(runtime, ResourcePool({2}), {"EchoWorker", Json::object()});
      keeper = app.spawn(holder, wg, 100);
      caf::scoped_actor self{app};
      self->request(keeper, caf::infinite, start_atom::value).receive([] {}, [](caf::error&) {});
    }
    // The Runtime is gone: the actor's copy of the group and its call in flight die with the
    // actor, on one of the application's scheduler threads.
    caf::scoped_actor self{app};
    std::string outcome;
    self->request(keeper, caf::infinite, drop_atom::value)
        .receive([&](std::string& s) { outcome = s; }, [&](caf::error& e) { outcome = app.render(e); });
    CHECK_THAT(outcome, Catch::Contains("the hyflow Runtime was shut down"));
  }
}

TEST_CASE("a Runtime on the caller's actor system runs groups there and leaves the system running") {
  register_worker_type<GateWorker>("GateWorker");
  AppConfig cfg;
  caf::actor_system app{cfg};
  {
    Runtime runtime(app);
    CHECK_FALSE(runtime.owns_system());
    WorkerGroup wg(runtime, ResourcePool({2}), {"GateWorker", Json::object()});
    DataProto out = wg.call(&GateWorker::twice, make_batch(4));
    CHECK(torch::equal(out.batch.at("x"), make_batch(4).batch.at("x") * 2));
    CHECK(&caf_protocol::system_of(runtime) == &app);
  }
  // The application's own actors keep working after the Runtime is gone.
  auto echo = app.spawn([]() -> caf::behavior { return {[](int x) { return x + 1; }}; });
  caf::scoped_actor self{app};
  int answer = 0;
  self->request(echo, caf::infinite, 41).receive([&](int x) { answer = x; }, [](caf::error&) {});
  CHECK(answer == 42);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST_CASE("a caller's actor system without hyflow's types is refused, naming register_types") {
  caf::actor_system_config cfg;
  caf::actor_system app{cfg};
  CHECK_THROWS_WITH(Runtime(app), Catch::Contains("Runtime::register_types"));
}

TEST_CASE("a group handle that outlives its Runtime fails calls with RuntimeStoppedError") {
  register_worker_type<GateWorker>("GateWorker");
  AppConfig cfg;
  caf::actor_system app{cfg};
  std::optional<WorkerGroup> kept;
  {
    Runtime runtime(app);
    kept.emplace(runtime, ResourcePool({2}), WorkerSpec{"GateWorker", Json::object()});
  }
  CHECK_THROWS_AS(kept->call("twice", make_batch(2)), RuntimeStoppedError);
  CHECK_THROWS_WITH(kept->call("twice", make_batch(2)), Catch::Contains("the hyflow Runtime was shut down"));
  auto copy = *kept;  // copies and destruction stay safe
  kept.reset();
}

namespace {
using ping_atom = caf::atom_constant<caf::atom("ping")>;
using go_atom = caf::atom_constant<caf::atom("go")>;

/// An application actor: on "go" it starts an asynchronous group call and forwards the result
/// (or the error's class and message) to `sink`; meanwhile it keeps answering pings.
caf::behavior async_caller(caf::event_based_actor* self, WorkerGroup group, caf::actor sink) {
  return {
      [=](ping_atom) { return std::string("pong"); },
      [=](go_atom, const std::string& what) {
        auto report_error = [=](caf::error& e) {
          self->send(sink, "error " + error_kind(e) + ": " + error_message(e));
        };
        if (what == "gate") {
          group.request(self, &GateWorker::wait_gate, 10)
              .then([=](std::vector<int> r) { self->send(sink, "ranks " + std::to_string(r[0] + r[1])); },
                    report_error);
        } else if (what == "twice") {
          group.request(self, &GateWorker::twice, make_batch(4))
              .then([=](DataProto d) { self->send(sink, "rows " + std::to_string(d.size())); }, report_error);
        } else {
          group.request(self, &GateWorker::fail_plainly, 1)
              .then([=](std::vector<int>) { self->send(sink, std::string("unexpected success")); }, report_error);
        }
      },
  };
}

std::string next_string(caf::scoped_actor& self) {
  std::string out;
  self->receive([&](std::string& s) { out = s; });
  return out;
}
}  // namespace

TEST_CASE("request(self, ...).then: an event-based actor keeps serving while its group call runs") {
  register_worker_type<GateWorker>("GateWorker");
  close_gate();
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  WorkerGroup wg(runtime, ResourcePool({2}), {"GateWorker", Json::object()});
  caf::scoped_actor self{app};
  auto caller = app.spawn(async_caller, wg, caf::actor_cast<caf::actor>(self));
  self->send(caller, go_atom::value, std::string("gate"));
  std::string pong;
  self->request(caller, caf::infinite, ping_atom::value).receive([&](std::string& s) { pong = s; }, [](caf::error&) {});
  CHECK(pong == "pong");  // answered while both workers still wait at the gate
  gate.set_value();
  CHECK(next_string(self) == "ranks 21");

  SECTION("typed results convert to the handler's parameter type") {
    self->send(caller, go_atom::value, std::string("twice"));
    CHECK(next_string(self) == "rows 4");
  }
  SECTION("a worker's std::runtime_error arrives as a caf::error naming its real class") {
    self->send(caller, go_atom::value, std::string("fail"));
    const auto s = next_string(self);
    CHECK_THAT(s, Catch::StartsWith("error std::runtime_error: "));
    CHECK_THAT(s, Catch::Contains("plain failure"));
  }
  caf::anon_send_exit(caller, caf::exit_reason::user_shutdown);
}

namespace {
/// The same calls in CAF's argument order, hyflow::request(self, group, timeout, message...):
/// reports "ranks N", or the error's code, class, method (from its context) and message.
caf::behavior timed_caller(caf::event_based_actor* self, WorkerGroup group, caf::actor sink) {
  return {
      [=](go_atom, const std::string& what, int timeout_ms) {
        auto report_error = [=](caf::error& e) {
          const std::string method =
              e.context().match_element<std::string>(2) ? e.context().get_as<std::string>(2) : "";
          self->send(sink, "error " + caf_protocol::to_string(static_cast<caf_protocol::errc>(e.code())) + " " +
                               error_kind(e) + " method=" + method + ": " + error_message(e));
        };
        auto report_ranks = [=](std::vector<int> r) { self->send(sink, "ranks " + std::to_string(r[0] + r[1])); };
        const auto timeout = std::chrono::milliseconds(timeout_ms);
        if (what == "typed")
          hyflow::request(self, group, timeout, &GateWorker::wait_gate, 10).then(report_ranks, report_error);
        else if (what == "by name")
          hyflow::request(self, group, timeout, "wait_gate", 10)
              .then([=](Value v) { report_ranks(from_value<std::vector<int>>(std::move(v), "wait_gate")); },
                    report_error);
        else
          hyflow::request(self, group, caf::infinite, &GateWorker::wait_gate, 10).then(report_ranks, report_error);
      },
  };
}
}  // namespace

TEST_CASE("hyflow::request(self, group, timeout, message): CAF's order; a passed timeout is a typed call_timeout") {
  register_worker_type<GateWorker>("GateWorker");
  close_gate();
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  WorkerGroup wg(runtime, ResourcePool({2}), {"GateWorker", Json::object()});
  caf::scoped_actor self{app};
  auto caller = app.spawn(timed_caller, wg, caf::actor_cast<caf::actor>(self));
  for (const std::string what : {"typed", "by name"}) {
    self->send(caller, go_atom::value, what, 200);  // the workers wait at the closed gate
    const auto s = next_string(self);
    CHECK_THAT(s, Catch::StartsWith("error call_timeout CallTimeoutError method=wait_gate: "));
    CHECK_THAT(s, Catch::Contains("wait_gate"));
  }
  gate.set_value();
  self->send(caller, go_atom::value, std::string("typed"), 10000);
  CHECK(next_string(self) == "ranks 21");
  self->send(caller, go_atom::value, std::string("infinite"), 0);
  CHECK(next_string(self) == "ranks 21");
  caf::anon_send_exit(caller, caf::exit_reason::user_shutdown);
}

TEST_CASE("a group as a CAF actor answers hf_call requests with the collected Value") {
  register_worker_type<GateWorker>("GateWorker");
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  WorkerGroup wg(runtime, ResourcePool({3}), {"GateWorker", Json::object()});
  group_actor actor = spawn_group_actor(app, wg);
  caf::scoped_actor self{app};
  int64_t rows = 0;
  self->request(actor, caf::infinite, call_atom::value, std::string("twice"), std::vector<Value>{Value(make_batch(6))})
      .receive([&](Value& v) { rows = v.dataproto().size(); }, [](caf::error&) {});
  CHECK(rows == 6);
  std::string kind;
  self->request(actor, caf::infinite, call_atom::value, std::string("no_such_method"), std::vector<Value>{})
      .receive([](Value&) {}, [&](caf::error& e) { kind = error_kind(e) + " / " + error_message(e); });
  CHECK_THAT(kind, Catch::StartsWith("BindError / ") && Catch::Contains("no_such_method"));
}

TEST_CASE("the caller chooses blocking or not per call; the method's flag stays the default") {
  register_worker_type<GateWorker>("GateWorker");
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  WorkerGroup wg(runtime, ResourcePool({2}), {"GateWorker", Json::object()});
  DataProtoFuture f = wg.call(CallOptions{.blocking = false}, &GateWorker::twice, make_batch(4));
  CHECK(f.get().size() == 4);
  Value v = wg.call(CallOptions{.blocking = false}, "fail_plainly", 1);
  REQUIRE(v.is_value_future());
  CHECK_THROWS_WITH(v.materialized(), Catch::Contains("std::runtime_error: plain failure"));
}

TEST_CASE("futures run continuations when the result arrives, without anyone calling get") {
  register_worker_type<GateWorker>("GateWorker");
  close_gate();
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  WorkerGroup wg(runtime, ResourcePool({2}), {"GateWorker", Json::object()});
  std::promise<std::string> seen;
  Value pending = wg.call(CallOptions{.blocking = false}, "wait_gate", 5);
  pending.value_future().then(
      [&](Value v) { seen.set_value("sum " + std::to_string(from_value<std::vector<int>>(v, "r")[1])); },
      [&](std::exception_ptr) { seen.set_value("failed"); });
  gate.set_value();
  CHECK(seen.get_future().get() == "sum 6");

  std::promise<int64_t> rows;
  DataProtoFuture doubled = wg.call(CallOptions{.blocking = false}, &GateWorker::twice, make_batch(6));
  doubled.then([](DataProto d) { return d.slice(0, 2); })
      .then([&](DataProto d) { rows.set_value(d.size()); }, [&](std::exception_ptr) { rows.set_value(-1); });
  CHECK(rows.get_future().get() == 2);

  SECTION("a blocking call from a continuation is refused instead of deadlocking the collector") {
    std::promise<std::string> refused;
    close_gate();
    Value next = wg.call(CallOptions{.blocking = false}, "wait_gate", 1);
    next.value_future().then(
        [&](Value) {
          try {
            wg.call("twice", make_batch(2));
            refused.set_value("ran");
          } catch (const NotSupportedError& e) {
            refused.set_value(e.what());
          }
        },
        [&](std::exception_ptr) { refused.set_value("failed"); });
    gate.set_value();  // the continuation runs on the collector thread, when the call completes
    CHECK_THAT(refused.get_future().get(), Catch::Contains("from a call's continuation"));
  }
}

namespace {
/// Counts what it places, then defers to the runtime's in-process launcher.
class CountingLauncher : public WorkerLauncher {
 public:
  explicit CountingLauncher(std::shared_ptr<WorkerLauncher> inner) : inner_(std::move(inner)) {}
  std::vector<WorkerRef> launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) override {
    launched += static_cast<int>(envs.size());
    return inner_->launch(spec, envs);
  }
  int launched = 0;

 private:
  std::shared_ptr<WorkerLauncher> inner_;
};
}  // namespace

TEST_CASE("a launcher per group places that group only; the Runtime's default stays") {
  register_worker_type<GateWorker>("GateWorker");
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  auto counting = std::make_shared<CountingLauncher>(runtime.in_process_launcher());
  WorkerGroup placed(runtime, ResourcePool({3}), {"GateWorker", Json::object()}, {.launcher = counting});
  WorkerGroup plain(runtime, ResourcePool({2}), {"GateWorker", Json::object()});
  CHECK(counting->launched == 3);
  CHECK(placed.call(&GateWorker::twice, make_batch(3)).operator DataProto().size() == 3);
  CHECK(plain.call(&GateWorker::twice, make_batch(2)).operator DataProto().size() == 2);
}
