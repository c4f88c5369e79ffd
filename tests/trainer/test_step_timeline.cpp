// trainer.profile_steps: a 3-step PPO run (GAE + critic, 2 colocated workers) writes the step
// timeline of step 2 only, and a validator checks it against the Chrome trace-event format:
// events well formed, every track named, spans nested or disjoint on each track, each call's
// dispatch and collect inside its phase and call, each worker's execution inside the call, and
// the phases of the step summing to timing_s/step; the same for separate_async (a rollout group
// of its own). Also the recorder alone, the key's errors and the validator's own failures.
#include "ppo_test_fixture.hpp"
#include "trace_validator.hpp"

#include <hyflow/actors/call_trace.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/ppo_config.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <thread>

using namespace hyflow;
using namespace hyflow::trainer;
using namespace ppo_test;
using namespace trace_test;
using actors::CallTrace;
using hyflow::ConfigKey;
using hyflow::KeyType;

TEST_CASE("trainer.profile_steps=[2]: step 2's timeline is a valid trace whose phases sum to timing_s/step") {
  TempDir out("timeline");
  Config c = small_config("gae", out.path);
  c.set("trainer.profile_steps", "[2]");
  c.set("trainer.test_freq", "-1");
  c.set("trainer.val_before_train", "false");
  PPOTrainer trainer(c);
  trainer.init_workers();
  trainer.fit();
  CHECK(CallTrace::active() == nullptr);

  // only the listed step wrote a file
  std::vector<std::string> files;
  for (const auto& f : fs::directory_iterator(out.path / "timeline")) files.push_back(f.path().filename());
  REQUIRE(files == std::vector<std::string>{"step_2.trace.json"});
  const Timeline tl = validate_format(read_json(out.path / "timeline" / "step_2.trace.json"));

  // tracks: the controller's and each worker's (2 colocated workers, one actor each)
  REQUIRE(tl.tracks.count("controller"));
  for (const char* worker : {"Colocated rank 0", "Colocated rank 1"}) {
    INFO(worker);
    REQUIRE(tl.tracks.count(worker));
    CHECK(std::count_if(tl.tracks.at(worker).begin(), tl.tracks.at(worker).end(),
                        [](const Span& s) { return s.cat == "execute"; }) >= 6);
  }
  for (const auto& [name, spans] : tl.tracks) require_nested(name, spans);

  const auto& ctl = tl.tracks.at("controller");
  std::vector<const Span*> steps;
  for (const auto& s : ctl)
    if (s.cat == "step") steps.push_back(&s);
  REQUIRE(steps.size() == 1);
  const Span& step = *steps.front();

  // every call's dispatch and collect: inside the call of the same method, inside a phase
  int calls = 0;
  for (const auto& s : ctl) {
    if (s.cat != "dispatch" && s.cat != "collect") continue;
    INFO(s.name);
    const Span* call = innermost(ctl, s, "call");
    REQUIRE(call);
    CHECK(s.name == call->name + " " + s.cat);
    CHECK(innermost(ctl, s, "phase"));
    calls += s.cat == "collect";
  }
  CHECK(calls >= 6);  // generate, old log-prob, ref, values, update critic, update actor

  // each worker's execution lies inside a controller call of that method (one clock: in-process)
  for (const auto& [name, spans] : tl.tracks) {
    if (name == "controller") continue;
    for (const auto& s : spans) {
      if (s.cat != "execute") continue;
      INFO(name << ": " << s.name);
      CHECK(std::any_of(ctl.begin(), ctl.end(),
                        [&](const Span& c) { return c.cat == "call" && c.contains(s) && ends_with(s.name, c.name); }));
    }
  }

  // the step's phases: verl's timing_s names and the untimed parts, summing to timing_s/step
  const Json* metrics = nullptr;
  for (const auto& m : trainer.history())
    if (m.at("step") == 2) metrics = &m;
  REQUIRE(metrics);
  const double step_us = metrics->at("timing_s/step").get<double>() * 1e6;
  CHECK(step.dur == Approx(step_us).margin(1.0));
  std::set<std::string> phases;
  double sum = 0;
  for (const auto& s : ctl) {
    if (s.cat != "phase" || !step.contains(s)) continue;
    const Span* parent = innermost(ctl, s, "phase");
    if (parent) continue;  // counted in its parent
    phases.insert(s.name);
    sum += s.dur;
  }
  for (const char* p : {"gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"}) {
    INFO(p);
    CHECK(phases.count(p));
    CHECK(metrics->contains(std::string("timing_s/") + p));
  }
  INFO("phases sum to " << sum << " us of the step's " << step_us << " us");
  CHECK(std::abs(sum - step_us) <= 0.05 * step_us);
}

TEST_CASE("separate_async: the rollout group's workers have tracks, spans stay nested, phases sum to the step") {
  TempDir out("timeline_async");
  Config c = small_config("grpo", out.path);
  c.set("trainer.v1.trainer_mode", "separate_async");
  c.set("trainer.v1.separate_async.num_warmup_batches", "1");
  c.set("actor_rollout_ref.rollout.n_gpus_per_node", "1");
  c.set("trainer.val_before_train", "false");
  c.set("trainer.test_freq", "-1");
  c.set("trainer.profile_steps", "[2]");
  PPOTrainer trainer(c);
  trainer.init_workers();
  trainer.fit();
  const Timeline tl = validate_format(read_json(out.path / "timeline" / "step_2.trace.json"));
  for (const auto& [name, spans] : tl.tracks) require_nested(name, spans);
  for (const char* track :
       {"controller", "Colocated rank 0", "Colocated rank 1", "rollout_ActorRolloutRefWorker rank 0"})
    CHECK(tl.tracks.count(track));
  const auto& ctl = tl.tracks.at("controller");
  const auto step = std::find_if(ctl.begin(), ctl.end(), [](const Span& s) { return s.cat == "step"; });
  REQUIRE(step != ctl.end());
  std::set<std::string> phases;
  double sum = 0;
  for (const auto& s : ctl)
    if (s.cat == "phase" && step->contains(s) && !innermost(ctl, s, "phase")) {
      phases.insert(s.name);
      sum += s.dur;
    }
  for (const char* p : {"gen", "reward", "old_log_prob", "update_actor", "update_weights"}) {
    INFO(p);
    CHECK(phases.count(p));
  }
  INFO("phases sum to " << sum << " us of the step's " << step->dur << " us");
  CHECK(std::abs(sum - step->dur) <= 0.05 * step->dur);
}

TEST_CASE("trainer.profile_steps must be a list of global steps, checked when the config is read") {
  TempDir out("timeline_keys");
  for (const char* bad : {"[0]", "abc", "[2, -1]", "[1.5]", "[true]"}) {
    INFO(bad);
    Config c = small_config("grpo", out.path);
    c.set("trainer.profile_steps", bad);
    CHECK_THROWS_AS(read_ppo_config(c), ValueError);
    CHECK_THROWS_WITH(read_ppo_config(c), Catch::Contains("trainer.profile_steps") &&
                                              Catch::Contains("a list of global steps (integers >= 1)"));
    CHECK_THROWS_AS(PPOTrainer(c), ValueError);  // before any data or worker
  }
  for (const char* off : {"null", "[]"}) {
    Config c = small_config("grpo", out.path);
    c.set("trainer.profile_steps", off);
    CHECK(read_ppo_config(c).trainer.profile_steps.empty());
  }
  Config c = small_config("grpo", out.path);
  c.set("trainer.profile_steps", "[3, 1]");
  CHECK(read_ppo_config(c).trainer.profile_steps == std::vector<int64_t>{3, 1});
  CHECK(read_ppo_config(small_config("grpo", out.path)).trainer.profile_steps.empty());  // off by default
  const auto keys = ppo_trainer_config_keys();
  const auto key =
      std::find_if(keys.begin(), keys.end(), [](const ConfigKey& k) { return k.name == "trainer.profile_steps"; });
  REQUIRE(key != keys.end());
  CHECK(key->type == KeyType::list);
  CHECK(key->nullable);
  CHECK(key->default_value.is_null());
}

TEST_CASE("CallTrace: spans only while recording, per-thread tracks, remote windows kept apart") {
  using Clock = CallTrace::Clock;
  CallTrace trace;
  { actors::TraceSpan before("phase", "not recorded"); }
  trace.start();
  CHECK(CallTrace::active() == &trace);
  CallTrace other;
  CHECK_THROWS_AS(other.start(), ValueError);
  { actors::TraceSpan span("phase", "gen", " dispatch"); }
  std::thread([] {
    actors::ThreadTrack track(CallTrace::worker_track("Colocated_0:1", 1));
    actors::TraceSpan span("execute", "work");
  }).join();
  std::thread([] { actors::TraceSpan span("collect", "on another thread"); }).join();
  // a remote worker seen from here: the second call was sent before the first answered
  const auto t0 = Clock::now();
  const auto remote = CallTrace::worker_track("rollout_W_1:0", 2);
  trace.add_observed(remote, "a", "execute (observed)", t0, t0 + std::chrono::microseconds(100));
  trace.add_observed(remote, "b", "execute (observed)", t0 + std::chrono::microseconds(10),
                     t0 + std::chrono::microseconds(150));
  trace.stop();
  CHECK(CallTrace::active() == nullptr);
  { actors::TraceSpan after("phase", "not recorded either"); }

  const Timeline tl = validate_format(trace.to_json());
  REQUIRE(tl.tracks.count("controller"));
  REQUIRE(tl.tracks.at("controller").size() == 1);
  CHECK(tl.tracks.at("controller")[0].name == "gen dispatch");
  REQUIRE(tl.tracks.count("Colocated rank 1"));
  CHECK(tl.tracks.at("Colocated rank 1")[0].name == "work");
  CHECK(tl.tracks.count("controller thread 1"));
  REQUIRE(tl.tracks.count("rollout_W rank 2"));
  const auto& r = tl.tracks.at("rollout_W rank 2");
  REQUIRE(r.size() == 2);
  CHECK(r[1].ts == Approx(r[0].end()).margin(kEps));  // b starts once a ended
  CHECK(r[1].dur == Approx(50).margin(kEps));
  for (const auto& [name, spans] : tl.tracks) require_nested(name, spans);
  CHECK(tl.processes.at(1) == "controller");
}

// The validator itself: each of these must fail (Catch's [!shouldfail]), or the checks above prove nothing.
TEST_CASE("validator: partially overlapping spans on one track are rejected", "[!shouldfail]") {
  require_nested("t", {Span{"a", "phase", 0, 10}, Span{"b", "phase", 5, 10}});
}

TEST_CASE("validator: a span on an unnamed thread is rejected", "[!shouldfail]") {
  validate_format(Json::parse(R"({"traceEvents": [
    {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "controller"}},
    {"name": "gen", "cat": "phase", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]})"));
}

TEST_CASE("validator: a negative duration is rejected", "[!shouldfail]") {
  validate_format(Json::parse(R"({"traceEvents": [
    {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "controller"}},
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "ts": 0, "args": {"name": "controller"}},
    {"name": "gen", "cat": "phase", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": -1}]})"));
}
