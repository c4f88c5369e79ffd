// Typed handles of worker groups (a CAF typed_actor whose interface follows the method table)
// and the application's own CAF actors as the workers of a group (issue 14, items 3 and 4).
#include <hyflow/actors/actor_workers.hpp>
#include <hyflow/actors/all.hpp>
#include <hyflow/actors/typed_group_actor.hpp>

#include <torch/torch.h>
#include <caf/all.hpp>
#include <catch2/catch.hpp>

using namespace hyflow;
using namespace hyflow::actors;

namespace {

DataProto make_batch(int64_t rows) {
  return DataProto(TensorDict{{"x", torch::arange(rows * 2, torch::kFloat32).reshape({rows, 2})}});
}

class PolicyWorker : public Worker {
 public:
  DataProto twice(DataProto batch) { return DataProto(TensorDict{{"x", batch.batch.at("x") * 2}}); }
  int plus_rank(int x) { return x + rank(); }
  int minus_rank(int x) { return x - rank(); }  // same signature as plus_rank, not registered
  std::string lead(const std::string& who) const { return who + " from rank " + std::to_string(rank()); }
  int fail(int) { throw std::runtime_error("plain failure"); }
  void touch(int x) { touched_ += x; }
  int touched() const { return touched_; }
  Json info() const { return Json{{"rank", rank()}, {"nested", {{"ok", true}}}}; }
  static void define_methods(MethodTable<PolicyWorker>& t) {
    t.add("twice", &PolicyWorker::twice, {.dispatch = Dispatch::DP_COMPUTE_PROTO});
    t.add("plus_rank", &PolicyWorker::plus_rank, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("lead", &PolicyWorker::lead, {.dispatch = Dispatch::ONE_TO_ALL, .execute = Execute::RANK_ZERO});
    t.add("fail", &PolicyWorker::fail, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("touch", &PolicyWorker::touch, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("touched", &PolicyWorker::touched, {.dispatch = Dispatch::ONE_TO_ALL});
    t.add("info", &PolicyWorker::info, {.dispatch = Dispatch::ONE_TO_ALL});
  }

 private:
  int touched_ = 0;
};

class CriticRole : public Worker {
 public:
  double value(double x) { return 10 * x; }
  static void define_methods(MethodTable<CriticRole>& t) {
    t.add("value", &CriticRole::value, {.dispatch = Dispatch::ALL_TO_ALL});
  }
};

using Twice = hyflow::method<"twice", &PolicyWorker::twice>;
using PlusRank = hyflow::method<"plus_rank", &PolicyWorker::plus_rank>;
using Lead = hyflow::method<"lead", &PolicyWorker::lead, std::string>;
using Fail = hyflow::method<"fail", &PolicyWorker::fail>;
using Touch = hyflow::method<"touch", &PolicyWorker::touch>;
using Touched = hyflow::method<"touched", &PolicyWorker::touched>;
using Info = hyflow::method<"info", &PolicyWorker::info>;
using Value_ = hyflow::method<"value", &CriticRole::value>;

using policy_actor = typed_group_actor<Twice, PlusRank, Lead, Fail, Touch, Touched>;

// The interface is the method table's, in CAF's own terms.
static_assert(
    std::is_same_v<typed_group_actor<Twice>, caf::typed_actor<caf::replies_to<Twice, DataProto>::with<DataProto>>>);
static_assert(std::is_same_v<typed_group_actor<PlusRank>,
                             caf::typed_actor<caf::replies_to<PlusRank, int>::with<std::vector<int>>>>);
static_assert(
    std::is_same_v<typed_group_actor<Lead>, caf::typed_actor<caf::replies_to<Lead, std::string>::with<std::string>>>);
static_assert(
    std::is_same_v<typed_group_actor<Info>, caf::typed_actor<caf::replies_to<Info>::with<std::vector<Json>>>>);
static_assert(std::is_same_v<typed_group_actor<Touch>, caf::typed_actor<caf::reacts_to<Touch, int>>>);
// A handle with more methods narrows to one with fewer, never the other way round.
// (CAF's own rule for converting typed handles: the target's signatures are a subset.)
template <class From, class To>
constexpr bool narrows_to = caf::detail::tl_subset_of<typename To::signatures, typename From::signatures>::value;
static_assert(narrows_to<policy_actor, typed_group_actor<Twice, PlusRank>>);
static_assert(!narrows_to<typed_group_actor<Twice>, policy_actor>);
static_assert(!narrows_to<policy_actor, caf::typed_actor<caf::replies_to<PlusRank, int>::with<int>>>);

struct AppConfig : caf::actor_system_config {
  AppConfig() {
    Runtime::register_types(*this);
    set("scheduler.max-threads", size_t{2});
  }
};

void register_workers() {
  register_worker_type<PolicyWorker>("TypedPolicy");
  register_worker_type<CriticRole>("TypedCritic");
}

std::string bind_error_of(const std::function<void()>& spawn) {
  try {
    spawn();
  } catch (const BindError& e) {
    return e.what();
  }
  return "no BindError";
}

using go_atom = caf::atom_constant<caf::atom("go")>;

/// An application actor composed with a typed group handle like with any typed actor of its
/// own: it keeps a narrowed handle and forwards results to `sink`.
caf::behavior rollout_driver(caf::event_based_actor* self, typed_group_actor<Twice, PlusRank> policy, caf::actor sink) {
  return {[=](go_atom, int rows) {
    self->request(policy, caf::infinite, Twice{}, make_batch(rows))
        .then(
            [=](DataProto out) {
              const float last = out.batch.at("x").flatten()[-1].item<float>();
              self->request(policy, caf::infinite, PlusRank{}, static_cast<int>(last))
                  .then([=](std::vector<int> per_rank) { self->send(sink, per_rank); },
                        [=](caf::error& e) { self->send(sink, error_kind(e)); });
            },
            [=](caf::error& e) { self->send(sink, error_kind(e)); });
  }};
}

}  // namespace

TEST_CASE("a typed group actor answers each method with the types of its method table") {
  register_workers();
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  WorkerGroup wg(runtime, ResourcePool({2}), {"TypedPolicy", Json::object()});
  policy_actor policy = spawn_typed_group_actor<Twice, PlusRank, Lead, Fail, Touch, Touched>(app, wg);
  caf::scoped_actor self{app};
  auto no_error = [](caf::error& e) { FAIL("unexpected error " << error_kind(e) << ": " << error_message(e)); };

  DataProto out;
  self->request(policy, caf::infinite, Twice{}, make_batch(4)).receive([&](DataProto d) { out = d; }, no_error);
  CHECK(torch::equal(out.batch.at("x"), make_batch(4).batch.at("x") * 2));

  std::vector<int> per_rank;
  self->request(policy, caf::infinite, PlusRank{}, 5).receive([&](std::vector<int> r) { per_rank = r; }, no_error);
  CHECK(per_rank == std::vector<int>{5, 6});

  std::string lead;
  self->request(policy, caf::infinite, Lead{}, std::string("hi")).receive([&](std::string s) { lead = s; }, no_error);
  CHECK(lead == "hi from rank 0");

  bool touched = false;
  self->request(policy, caf::infinite, Touch{}, 3).receive([&] { touched = true; }, no_error);
  CHECK(touched);
  self->request(policy, caf::infinite, Touched{}).receive([&](std::vector<int> r) { per_rank = r; }, no_error);
  CHECK(per_rank == std::vector<int>{3, 3});

  SECTION("Json results are CAF message types (in-process, and through CAF's serializers)") {
    auto info = spawn_typed_group_actor<Info>(app, wg);
    std::vector<Json> records;
    self->request(info, caf::infinite, Info{}).receive([&](std::vector<Json> r) { records = r; }, no_error);
    REQUIRE(records.size() == 2);
    CHECK(records[1]["rank"] == 1);
    std::vector<char> buf;
    caf::binary_serializer sink{app, buf};
    REQUIRE_FALSE(sink(records));
    std::vector<Json> back;
    caf::binary_deserializer source{app, buf};
    REQUIRE_FALSE(source(back));
    CHECK(back == records);
    CHECK_THAT(caf::deep_to_string(records[0]), Catch::Contains("nested"));
    caf::anon_send_exit(info, caf::exit_reason::user_shutdown);
  }
  SECTION("a worker's std::runtime_error arrives as a caf::error of the hyflow category naming its class") {
    caf::error err;
    self->request(policy, caf::infinite, Fail{}, 1).receive([](std::vector<int>) {}, [&](caf::error& e) { err = e; });
    CHECK(err.category() == caf::atom("hyflow"));
    CHECK(err.code() == static_cast<uint8_t>(caf_protocol::errc::method_failed));
    CHECK(error_kind(err) == "std::runtime_error");
    CHECK_THAT(error_message(err), Catch::Contains("plain failure"));
  }
  caf::anon_send_exit(policy, caf::exit_reason::user_shutdown);
}

TEST_CASE("a typed group actor outliving its Runtime fails calls with runtime_stopped") {
  register_workers();
  AppConfig cfg;
  caf::actor_system app{cfg};
  std::optional<Runtime> runtime(std::in_place, app);
  auto policy = spawn_typed_group_actor<PlusRank>(app, WorkerGroup(*runtime, ResourcePool({2}), {"TypedPolicy", {}}));
  runtime.reset();  // stops every group it made, the one the actor holds included
  caf::scoped_actor self{app};
  caf::error err;
  self->request(policy, caf::infinite, PlusRank{}, 1).receive([](std::vector<int>) {}, [&](caf::error& e) { err = e; });
  CHECK(err.code() == static_cast<uint8_t>(caf_protocol::errc::runtime_stopped));
  CHECK(error_kind(err) == "RuntimeStoppedError");
  caf::anon_send_exit(policy, caf::exit_reason::user_shutdown);
}

TEST_CASE("an application actor composes a narrowed typed group handle with request().then") {
  register_workers();
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  WorkerGroup wg(runtime, ResourcePool({2}), {"TypedPolicy", Json::object()});
  policy_actor policy = spawn_typed_group_actor<Twice, PlusRank, Lead, Fail, Touch, Touched>(app, wg);
  caf::scoped_actor self{app};
  auto driver = app.spawn(rollout_driver, policy, caf::actor_cast<caf::actor>(self));  // narrowed here
  self->send(driver, go_atom::value, 4);
  std::vector<int> got;
  self->receive([&](std::vector<int>& r) { got = r; }, [&](std::string& kind) { FAIL("error " << kind); });
  CHECK(got == std::vector<int>{14, 15});  // rows 4: last element 7 * 2 = 14, plus the rank
  caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(policy, caf::exit_reason::user_shutdown);
}

TEST_CASE("spawning a typed group actor refuses an interface that does not fit the method table, naming the method") {
  register_workers();
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  WorkerGroup wg(runtime, ResourcePool({2}), {"TypedPolicy", Json::object()});

  SECTION("a method the table lacks") {
    using Missing = hyflow::method<"minus_rank", &PolicyWorker::minus_rank>;
    const auto what = bind_error_of([&] { spawn_typed_group_actor<Twice, Missing>(app, wg); });
    CHECK_THAT(what, Catch::Contains("method 'minus_rank'") && Catch::Contains("not in the group's method table") &&
                         Catch::Contains("plus_rank"));
  }
  SECTION("a name registered for another member of the same signature") {
    using Wrong = hyflow::method<"plus_rank", &PolicyWorker::minus_rank>;
    const auto what = bind_error_of([&] { spawn_typed_group_actor<Wrong>(app, wg); });
    CHECK_THAT(what, Catch::Contains("method 'plus_rank'") && Catch::Contains("another member function"));
  }
  SECTION("a signature that differs from the registered one") {
    using Wrong = hyflow::named_method<"plus_rank", int(std::string)>;
    const auto what = bind_error_of([&] { spawn_typed_group_actor<Wrong>(app, wg); });
    CHECK_THAT(what, Catch::Contains("registered as plus_rank(integer) -> integer") &&
                         Catch::Contains("declares plus_rank(string) -> integer"));
  }
  SECTION("a result shape the dispatch mode does not produce") {
    using OneResult = hyflow::method<"plus_rank", &PolicyWorker::plus_rank, int>;
    const auto one = bind_error_of([&] { spawn_typed_group_actor<OneResult>(app, wg); });
    CHECK_THAT(one,
               Catch::Contains("method 'plus_rank' (dispatch ONE_TO_ALL, execute ALL) answers one integer per rank"));
    using PerRank = hyflow::method<"lead", &PolicyWorker::lead>;  // default: one per rank; RANK_ZERO answers one
    const auto many = bind_error_of([&] { spawn_typed_group_actor<PerRank>(app, wg); });
    CHECK_THAT(many, Catch::Contains("method 'lead'") && Catch::Contains("answers one string"));
  }
  SECTION("a matching signature by name is accepted, and Value accepts any shape") {
    using ByName = hyflow::named_method<"plus_rank", int(int)>;
    using Any = hyflow::method<"lead", &PolicyWorker::lead, Value>;
    auto actor = spawn_typed_group_actor<ByName, Any>(app, wg);
    caf::scoped_actor self{app};
    std::vector<int> r;
    self->request(actor, caf::infinite, ByName{}, 1).receive([&](std::vector<int> v) { r = v; }, [](caf::error&) {});
    CHECK(r == std::vector<int>{1, 2});
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("each spawned role of a colocated group gets a typed actor of its own methods") {
  register_workers();
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  WorkerGroup bundle(
      runtime, ResourcePool({2}),
      colocated_spec({{"actor", {"TypedPolicy", Json::object()}}, {"critic", {"TypedCritic", Json::object()}}}));
  auto roles = bundle.spawn({"actor", "critic"});
  auto actor = spawn_typed_group_actor<Twice, PlusRank>(app, roles.at("actor"));
  auto critic = spawn_typed_group_actor<Value_>(app, roles.at("critic"));
  const auto what = bind_error_of([&] { spawn_typed_group_actor<Twice>(app, roles.at("critic")); });
  CHECK_THAT(what, Catch::Contains("worker type 'TypedCritic': method 'twice'"));

  caf::scoped_actor self{app};
  std::vector<int> a;
  std::vector<double> c;
  self->request(actor, caf::infinite, PlusRank{}, 7).receive([&](std::vector<int> v) { a = v; }, [](caf::error&) {});
  self->request(critic, caf::infinite, Value_{}, 0.5)
      .receive([&](std::vector<double> v) { c = v; }, [](caf::error&) {});
  CHECK(a == std::vector<int>{7, 8});
  CHECK(c == std::vector<double>{5.0, 5.0});
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(critic, caf::exit_reason::user_shutdown);
}

// ---- own actors as workers ----------------------------------------------------------------

namespace {
using score_atom = caf::atom_constant<caf::atom("score")>;
using offset_atom = caf::atom_constant<caf::atom("offset")>;
using reset_atom = caf::atom_constant<caf::atom("reset")>;
using quit_atom = caf::atom_constant<caf::atom("quit")>;

/// An application's own actor, unaware of hyflow: scores rows, answers its offset, quits on request.
caf::behavior scorer(caf::event_based_actor* self, int offset) {
  return {
      [=](score_atom, DataProto& batch) {
        return DataProto(TensorDict{{"score", batch.batch.at("x").sum(1) + offset}});
      },
      [=](offset_atom, int plus) { return offset + plus; },
      [=](reset_atom) {},
      [=](quit_atom) {  // ends without answering, as a crash would
        self->quit();
        return self->make_response_promise();
      },
  };
}

/// The few lines that make it a worker type (the same in each test).
ActorWorkers scorer_workers(Runtime& runtime) {
  ActorWorkers workers(runtime, "Scorer",
                       [](caf::actor_system& sys, const WorkerEnv& env) { return sys.spawn(scorer, 100 * env.rank); });
  workers.method<score_atom, DataProto(DataProto)>("score", {.dispatch = Dispatch::DP_COMPUTE_PROTO})
      .method<offset_atom, int(int)>("offset", {.dispatch = Dispatch::ONE_TO_ALL})
      .method<reset_atom, void()>("reset", {.dispatch = Dispatch::ONE_TO_ALL})
      .method<quit_atom, int()>("quit", {.dispatch = Dispatch::ONE_TO_ALL});
  return workers;
}
}  // namespace

TEST_CASE("an application's own event-based actors serve a group's calls as its workers") {
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  ActorWorkers workers = scorer_workers(runtime);
  WorkerGroup scorers = workers.make_group(ResourcePool({2}));
  CHECK(scorers.world_size() == 2);
  CHECK(scorers.worker_type() == "Scorer");

  DataProto scored = scorers.call("score", make_batch(4)).dataproto();  // rows 0,1 on rank 0, rows 2,3 on rank 1
  auto s = scored.batch.at("score");
  CHECK(s.size(0) == 4);
  CHECK(s[0].item<float>() == 1.0f);    // 0 + 1
  CHECK(s[3].item<float>() == 113.0f);  // 6 + 7 + 100
  CHECK(from_value<std::vector<int>>(scorers.call("offset", 1), "offset") == std::vector<int>{1, 101});
  CHECK_NOTHROW(scorers.call("reset"));

  SECTION("a typed group actor over them, by name and signature") {
    using Offset = hyflow::named_method<"offset", int(int)>;
    auto typed = spawn_typed_group_actor<Offset>(app, scorers);
    caf::scoped_actor self{app};
    std::vector<int> r;
    self->request(typed, caf::infinite, Offset{}, 2).receive([&](std::vector<int> v) { r = v; }, [](caf::error&) {});
    CHECK(r == std::vector<int>{2, 102});
    using Wrong = hyflow::named_method<"offset", int(double)>;
    CHECK_THROWS_AS(spawn_typed_group_actor<Wrong>(app, scorers), BindError);
    caf::anon_send_exit(typed, caf::exit_reason::user_shutdown);
  }
  SECTION("an argument of the wrong type fails the call naming it; the actors stay usable") {
    CHECK_THROWS_WITH(scorers.call("offset", std::string("x")), Catch::Contains("argument 0 of 'offset'"));
    CHECK(from_value<std::vector<int>>(scorers.call("offset", 0), "offset") == std::vector<int>{0, 100});
  }
  SECTION("an actor that ends is the worker's death for the group") {
    CHECK_THROWS_AS(scorers.call("quit"), WorkerDiedError);
    CHECK_THROWS_AS(scorers.call("offset", 1), WorkerDiedError);
  }
}

TEST_CASE("actor workers: the group's end ends the application's actors; declarations are one per name") {
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  caf::actor seen;
  ActorWorkers workers(runtime, "Scorer", [&](caf::actor_system& sys, const WorkerEnv&) {
    seen = sys.spawn(scorer, 0);
    return seen;
  });
  workers.method<score_atom, DataProto(DataProto)>("score", {.dispatch = Dispatch::DP_COMPUTE_PROTO})
      .method<offset_atom, int(int)>("offset", {.dispatch = Dispatch::ONE_TO_ALL})
      .method<reset_atom, void()>("reset", {.dispatch = Dispatch::ONE_TO_ALL})
      .method<quit_atom, int()>("quit", {.dispatch = Dispatch::ONE_TO_ALL});
  caf::scoped_actor self{app};
  {
    WorkerGroup one = workers.make_group(ResourcePool({1}));  // same declarations as before: same type
    self->monitor(seen);
  }  // the last handle of the group is gone: its workers stop, and the actor with them
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; });
  CHECK(down);

  ActorWorkers other(runtime, "Scorer", [](caf::actor_system& sys, const WorkerEnv&) { return sys.spawn(scorer, 0); });
  other.method<offset_atom, int(int)>("offset", {.dispatch = Dispatch::ALL_TO_ALL});
  CHECK_THROWS_WITH(other.launcher(), Catch::Contains("'Scorer' is already registered in this process"));
  CHECK_THROWS_AS((workers.method<reset_atom, void()>("later")), ValueError);
  CHECK_THROWS_WITH(WorkerGroup(runtime, ResourcePool({1}), workers.spec()), Catch::Contains("ActorWorkers"));
}

TEST_CASE("actor workers: a factory that fails names the rank and stops the ranks made so far") {
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  std::vector<caf::actor> made;
  ActorWorkers flaky(runtime, "FlakyScorer", [&](caf::actor_system& sys, const WorkerEnv& env) {
    if (env.rank == 1) throw ValueError("no judge for rank 1");
    made.push_back(sys.spawn(scorer, 0));
    return made.back();
  });
  flaky.method<offset_atom, int(int)>("offset", {.dispatch = Dispatch::ONE_TO_ALL});
  caf::scoped_actor self{app};
  CHECK_THROWS_WITH(flaky.make_group(ResourcePool({2})),
                    Catch::Contains("failed on rank 1 of 2") && Catch::Contains("no judge for rank 1"));
  REQUIRE(made.size() == 1);
  self->monitor(made[0]);
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; });
  CHECK(down);
}

TEST_CASE("actor workers: kill_worker ends that rank's actor and fails its later calls") {
  AppConfig cfg;
  caf::actor_system app{cfg};
  Runtime runtime(app);
  std::vector<caf::actor> made;
  ActorWorkers workers(runtime, "CountedScorer", [&](caf::actor_system& sys, const WorkerEnv& env) {
    made.push_back(sys.spawn(scorer, env.rank));
    return made.back();
  });
  workers.method<offset_atom, int(int)>("offset", {.dispatch = Dispatch::ONE_TO_ALL});
  WorkerGroup group = workers.make_group(ResourcePool({2}));
  REQUIRE(made.size() == 2);
  caf::scoped_actor self{app};
  self->monitor(made[1]);
  group.kill_worker(1);
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; });
  CHECK(down);
  CHECK_THROWS_AS(group.call("offset", 1), WorkerDiedError);
}
