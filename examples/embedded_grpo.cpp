// An existing CAF application that embeds a GRPO-style controller (docs/embedding.md).
//
// The application has its own actor system, its own message type (StepReport) and its own
// event-based actors: a `logger`, a `judge` (its reward function) and a `trainer` actor. hyflow
// runs on the application's actor system (Runtime(system), Runtime::register_types on its
// config). The judge actors become the workers of the reward group as they are (ActorWorkers).
// The trainer sees both groups as typed CAF actors whose interfaces come from their method
// tables (typed_group_actor) and drives them with asynchronous requests, never blocking its
// scheduler thread: generate -> reward -> group-relative advantages -> update, for a few steps.
// Shutdown: the Runtime goes first while the trainer still holds its typed group handles; the
// trainer, the group actors and the logger end afterwards, then the actor system. Run 20 times
// in a row as a test.
#include <hyflow/actors/actor_workers.hpp>
#include <hyflow/actors/all.hpp>
#include <hyflow/actors/typed_group_actor.hpp>

#include <torch/torch.h>
#include <caf/all.hpp>

#include <cstdio>
#include <iostream>

using hyflow::DataProto;
using hyflow::Json;
using hyflow::TensorDict;

// ---- the application's own types and actors -------------------------------------------------

namespace app {

struct StepReport {
  int step = 0;
  double mean_reward = 0;
  double theta = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepReport& x) {
  return f(caf::meta::type_name("app::StepReport"), x.step, x.mean_reward, x.theta);
}

using train_atom = caf::atom_constant<caf::atom("train")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using judge_atom = caf::atom_constant<caf::atom("judge")>;

struct Config : caf::actor_system_config {
  Config() {
    add_message_type<StepReport>("app::StepReport");
    hyflow::Runtime::register_types(*this);  // the one line hyflow needs
    set("scheduler.max-threads", size_t{2});
  }
};

/// Prints what the trainer reports, in order.
caf::behavior logger(caf::event_based_actor*) {
  return {[](const StepReport& r) {
    std::printf("step %d: mean reward %.4f, theta %.4f\n", r.step, r.mean_reward, r.theta);
    std::fflush(stdout);
  }};
}

/// The application's reward function, an actor that knows nothing of hyflow: closeness of each
/// response to 1 (a rule reward, like verl's reward functions).
caf::behavior judge(caf::event_based_actor*) {
  return {[](judge_atom, DataProto& batch) {
    auto r = -(batch.batch.at("response") - 1.0).pow(2);
    return DataProto(TensorDict{{"reward", r}});
  }};
}

}  // namespace app

// ---- a hyflow worker class: a toy policy ---------------------------------------------------

/// A one-parameter "policy": for prompt p, response i of its group is theta + p/10 + offset_i.
class ToyPolicy : public hyflow::Worker {
 public:
  explicit ToyPolicy(const Json& cfg) : lr_(cfg.value("lr", 0.5)) {}

  // DP_COMPUTE_PROTO: each rank answers its chunk of the (repeated) prompts.
  DataProto generate(DataProto prompts) {
    auto p = prompts.batch.at("prompt");
    auto offset = prompts.batch.at("sample").to(torch::kFloat64) * 0.2 - 0.3;  // 4 samples: -0.3 .. 0.3
    DataProto out(TensorDict{{"response", theta_ + p.to(torch::kFloat64) / 10 + offset}});
    return out;
  }
  // ONE_TO_ALL: every rank applies the same policy-gradient step, so they stay in agreement.
  Json update(DataProto batch) {
    auto adv = batch.batch.at("advantage");
    auto centered = batch.batch.at("response") - theta_;
    theta_ += lr_ * (adv * centered).mean().item<double>();
    return Json{{"theta", theta_}, {"rank", rank()}};
  }
  static void define_methods(hyflow::MethodTable<ToyPolicy>& t) {
    t.add("generate", &ToyPolicy::generate, {.dispatch = hyflow::Dispatch::DP_COMPUTE_PROTO});
    t.add("update", &ToyPolicy::update, {.dispatch = hyflow::Dispatch::ONE_TO_ALL});
  }

 private:
  double lr_;
  double theta_ = 0.0;
};
HYFLOW_REGISTER_WORKER(ToyPolicy, "ToyPolicy");

// ---- the trainer: an event-based actor of the application, driving the groups -----------------

// The groups as typed CAF actors: one message per method, types from the method tables.
using Generate = hyflow::method<"generate", &ToyPolicy::generate>;  // DataProto -> DataProto
using Update = hyflow::method<"update", &ToyPolicy::update>;        // DataProto -> one Json per rank
using Score = hyflow::named_method<"score", DataProto(DataProto)>;  // the judges' method (below)
using policy_actor = hyflow::typed_group_actor<Generate, Update>;
using reward_actor = hyflow::typed_group_actor<Score>;

namespace app {

struct trainer_state {
  policy_actor policy;
  reward_actor reward;
  caf::actor log;
  int steps = 0, step = 0;
  caf::response_promise done;
  DataProto prompts;
};

constexpr int kGroupSize = 4;  // GRPO's n: responses per prompt

/// GRPO's advantage: each reward minus its group's mean, over the group's standard deviation.
torch::Tensor group_advantages(const torch::Tensor& rewards) {
  auto g = rewards.reshape({-1, kGroupSize});
  auto adv = (g - g.mean(1, true)) / (g.std(1, true, true) + 1e-6);
  return adv.reshape({-1});
}

void run_step(caf::stateful_actor<trainer_state>* self);

void on_error(caf::stateful_actor<trainer_state>* self, const caf::error& e) {
  std::cerr << "trainer: " << hyflow::error_kind(e) << ": " << hyflow::error_message(e) << std::endl;
  self->state.done.deliver(e);
}

void run_step(caf::stateful_actor<trainer_state>* self) {
  auto& st = self->state;
  if (st.step == st.steps) {
    st.done.deliver(st.step);
    return;
  }
  ++st.step;
  auto fail = [self](caf::error& e) { on_error(self, e); };
  self->request(st.policy, caf::infinite, Generate{}, st.prompts)
      .then(
          [self, fail](DataProto responses) {
            self->request(self->state.reward, caf::infinite, Score{}, responses)
                .then(
                    [self, fail, responses](DataProto scored) mutable {
                      auto& st = self->state;
                      auto rewards = scored.batch.at("reward");
                      responses.batch.set("advantage", group_advantages(rewards));
                      const double mean_reward = rewards.mean().item<double>();
                      self->request(st.policy, caf::infinite, Update{}, responses)
                          .then(
                              [self, mean_reward](std::vector<Json> per_rank) {
                                self->send(self->state.log, StepReport{self->state.step, mean_reward,
                                                                       per_rank[0]["theta"].get<double>()});
                                run_step(self);
                              },
                              fail);
                    },
                    fail);
          },
          fail);
}

caf::behavior trainer(caf::stateful_actor<trainer_state>* self, policy_actor policy, reward_actor reward,
                      caf::actor log) {
  self->state.policy = std::move(policy);
  self->state.reward = std::move(reward);
  self->state.log = std::move(log);
  // 3 prompts x kGroupSize samples, interleaved: rows (p0 s0..s3), (p1 s0..s3), ...
  auto prompt = torch::arange(3, torch::kInt64).repeat_interleave(kGroupSize);
  auto sample = torch::arange(kGroupSize, torch::kInt64).repeat({3});
  self->state.prompts = DataProto(TensorDict{{"prompt", prompt}, {"sample", sample}});
  return {
      [=](train_atom, int steps) {
        self->state.steps = steps;
        self->state.done = self->make_response_promise();
        run_step(self);
        return self->state.done;
      },
      [=](stop_atom) { self->quit(); },  // drops its typed group handles, after the Runtime is gone
  };
}

}  // namespace app

int main() {
  app::Config cfg;
  caf::actor_system system{cfg};
  caf::actor log = system.spawn(app::logger);
  caf::actor trainer;
  int steps_done = 0;
  {
    hyflow::Runtime runtime(system);
    hyflow::WorkerGroup policy(runtime, hyflow::ResourcePool({2}), {"ToyPolicy", {{"lr", 0.5}}});
    // The application's judge actors as the reward group's workers, one per rank.
    hyflow::ActorWorkers judges(runtime, "AppJudge",
                                [](caf::actor_system& sys, const hyflow::WorkerEnv&) { return sys.spawn(app::judge); });
    judges.method<app::judge_atom, DataProto(DataProto)>("score", {.dispatch = hyflow::Dispatch::DP_COMPUTE_PROTO});
    hyflow::WorkerGroup reward = judges.make_group(hyflow::ResourcePool({2}));
    // Interfaces are checked here, at spawn (a BindError names a method that does not fit).
    trainer = system.spawn(app::trainer, hyflow::spawn_typed_group_actor<Generate, Update>(system, policy),
                           hyflow::spawn_typed_group_actor<Score>(system, reward), log);
    caf::scoped_actor self{system};
    self->request(trainer, caf::infinite, app::train_atom::value, 5)
        .receive([&](int n) { steps_done = n; },
                 [&](caf::error& e) { std::cerr << "training failed: " << system.render(e) << std::endl; });
  }  // ~Runtime: groups, workers and judges stop; the trainer still holds (now inert) group actors
  caf::anon_send(trainer, app::stop_atom::value);  // its group actors end with their last handle
  caf::anon_send_exit(log, caf::exit_reason::user_shutdown);
  std::printf("trained %d steps; clean shutdown\n", steps_done);
  return steps_done == 5 ? 0 : 1;
}
