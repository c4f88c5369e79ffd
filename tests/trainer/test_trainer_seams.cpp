// The trainer's seams: config errors before anything is launched, a role added to a role table
// and placed, and a trainer loop of its own written on the public pieces (config sections, role
// table, placement, trackers) without the PPO trainer's file.
#include "ppo_test_fixture.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/agents/agent_config.hpp>
#include <hyflow/tracking/tracking.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/placement.hpp>
#include <hyflow/trainer/ppo_config.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>
#include <hyflow/trainer/reward_manager.hpp>
#include <hyflow/trainer/worker_roles.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <fstream>

using namespace hyflow;
using namespace hyflow::trainer;
using namespace ppo_test;
using hyflow::trainer::PPOTrainer;
using workers::ActorRolloutRefWorker;

namespace {

/// A toy role: counts its constructions and answers its rank.
class TallyWorker : public Worker {
 public:
  static inline std::atomic<int> constructed{0};
  explicit TallyWorker(const Json& args) : label_(args.value("label", "")) { ++constructed; }
  std::string hello() { return label_ + std::to_string(rank()); }
  static void define_methods(MethodTable<TallyWorker>& t) {
    t.add("hello", &TallyWorker::hello, {.dispatch = Dispatch::ALL_TO_ALL});
  }

 private:
  std::string label_;
};
HYFLOW_REGISTER_WORKER(TallyWorker, "TallyWorker");

/// A toy role that answers the device its worker was placed on (no CUDA call: placement only).
class DeviceProbe : public Worker {
 public:
  explicit DeviceProbe(const Json&) {}
  std::string where() { return device(); }
  static void define_methods(MethodTable<DeviceProbe>& t) {
    t.add("where", &DeviceProbe::where, {.dispatch = Dispatch::ALL_TO_ALL});
  }
};
HYFLOW_REGISTER_WORKER(DeviceProbe, "DeviceProbe");

Config with(std::vector<std::string> args, const fs::path& out) {
  Config c = small_config("grpo", out);
  c.apply_arguments(args);
  return c;
}

}  // namespace

TEST_CASE("a bad value fails when the config is read, naming the key, before data or workers are touched") {
  TempDir dir("seams_config");
  const std::string missing_model = "--actor_rollout_ref.model.path=" + (dir.path / "no-model").string();
  // The model folder does not exist: an error about it would mean loading began before the check.
  CHECK_THROWS_WITH(PPOTrainer(with({missing_model, "--actor_rollout_ref.rollout.top_p=1.5"}, dir.path)),
                    Catch::Contains("actor_rollout_ref.rollout.top_p") && Catch::Contains("(0, 1]"));
  CHECK_THROWS_WITH(PPOTrainer(with({missing_model, "--actor_rollout_ref.rollout.name=vllm"}, dir.path)),
                    Catch::Contains("actor_rollout_ref.rollout.name") && Catch::Contains("'vllm'"));
  CHECK_THROWS_WITH(PPOTrainer(with({missing_model, "--trainer.n_gpus_per_node=3"}, dir.path)),
                    Catch::Contains("data.train_batch_size") && Catch::Contains("divisible"));
  CHECK_THROWS_WITH(PPOTrainer(with({missing_model, "--trainer.logger=['console','wandbb']"}, dir.path)),
                    Catch::Contains("trainer.logger") && Catch::Contains("'wandbb'"));
  CHECK_THROWS_WITH(PPOTrainer(with({missing_model, "--critic.enable=true", "--critic.cliprange_value=-1"}, dir.path)),
                    Catch::Contains("critic.cliprange_value"));
  CHECK_THROWS_WITH(PPOTrainer(with({missing_model, "--trainer.v1.trainer_mode=separate"}, dir.path)),
                    Catch::Contains("trainer.v1.trainer_mode"));
  // read_ppo_config is the same check, on its own
  CHECK_THROWS_WITH(read_ppo_config(with({"--algorithm.rollout_correction.rollout_is=token"}, dir.path)),
                    Catch::Contains("calculate_log_probs"));
  CHECK_NOTHROW(read_ppo_config(with({}, dir.path)));
}

TEST_CASE("actor.strategy and rollout.name have one owner: the worker schema declares them") {
  const auto worker_keys = workers::worker_config_keys();
  for (const char* key : {"actor_rollout_ref.actor.strategy", "actor_rollout_ref.rollout.name"}) {
    INFO(key);
    CHECK(std::count_if(worker_keys.begin(), worker_keys.end(), [&](const ConfigKey& k) { return k.name == key; }) ==
          1);
    const auto trainer_keys = ppo_trainer_config_keys();
    CHECK(std::none_of(trainer_keys.begin(), trainer_keys.end(), [&](const ConfigKey& k) { return k.name == key; }));
  }
}

TEST_CASE("a role added to the role table is placed on its pool, colocated, and checked before launch") {
  std::vector<RoleSpec> roles = {
      {.name = "tally", .worker_type = "TallyWorker", .init_args = {{"label", "t"}}},
      {.name = "tally2", .worker_type = "TallyWorker", .init_args = {{"label", "u"}}},
      {.name = "off", .worker_type = "TallyWorker", .enabled = false},
      {.name = "alone", .worker_type = "TallyWorker", .init_args = {{"label", "a"}}, .pool = "side"}};
  const std::vector<PoolSpec> pools = {{.name = "global", .workers_per_node = {2}},
                                       {.name = "side", .workers_per_node = {1}, .name_prefix = "side_"}};
  const int before = TallyWorker::constructed.load();
  {
    Placement placement(roles, pools, TrainerSection{}, ClusterSection{});
    CHECK(std::vector<std::string>(placement.group("tally").call(&TallyWorker::hello)) ==
          std::vector<std::string>{"t0", "t1"});
    CHECK(std::vector<std::string>(placement.group("tally2").call(&TallyWorker::hello)) ==
          std::vector<std::string>{"u0", "u1"});
    CHECK(std::vector<std::string>(placement.group("alone").call(&TallyWorker::hello)) ==
          std::vector<std::string>{"a0"});
    CHECK(placement.find("off") == nullptr);
    CHECK_THROWS_AS(placement.group("off"), KeyError);
  }
  CHECK(TallyWorker::constructed.load() == before + 5);  // 2 ranks x 2 colocated roles + 1

  // a failing check stops the placement before any worker is constructed
  roles[1].check = [](const Json& args) { throw ValueError("config key 'tally2.label' is bad: " + args.dump()); };
  const int now = TallyWorker::constructed.load();
  CHECK_THROWS_WITH(Placement(roles, pools, TrainerSection{}, ClusterSection{}), Catch::Contains("tally2.label"));
  CHECK(TallyWorker::constructed.load() == now);
  roles[1].check = nullptr;
  roles[3].pool = "nowhere";
  CHECK_THROWS_WITH(Placement(roles, pools, TrainerSection{}, ClusterSection{}),
                    Catch::Contains("'alone'") && Catch::Contains("'nowhere'"));
}

TEST_CASE("pools on one process get disjoint GPUs, colocated roles share theirs (4 GPUs injected, no CUDA)") {
  const std::vector<RoleSpec> roles = {{.name = "actor", .worker_type = "DeviceProbe"},
                                       {.name = "ref", .worker_type = "DeviceProbe"},
                                       {.name = "rollout", .worker_type = "DeviceProbe", .pool = "rollout"}};
  const std::vector<PoolSpec> pools = {{.name = "global", .workers_per_node = {2}},
                                       {.name = "rollout", .workers_per_node = {2}, .name_prefix = "rollout_"}};
  TrainerSection gpu;
  gpu.device = "cuda";
  const auto devices = [](Placement& p, const std::string& role) {
    return std::vector<std::string>(p.group(role).call(&DeviceProbe::where));
  };
  {
    Placement placement(roles, pools, gpu, ClusterSection{}, /*gpus_in_process=*/4);
    CHECK(devices(placement, "actor") == std::vector<std::string>{"cuda:0", "cuda:1"});
    CHECK(devices(placement, "ref") == std::vector<std::string>{"cuda:0", "cuda:1"});  // colocated: shared
    CHECK(devices(placement, "rollout") == std::vector<std::string>{"cuda:2", "cuda:3"});
  }
  {  // two in-process nodes of one pool are one process: they do not share either
    Placement placement({roles[0]}, {{.name = "global", .workers_per_node = {2, 2}}}, gpu, ClusterSection{}, 4);
    CHECK(devices(placement, "actor") == std::vector<std::string>{"cuda:0", "cuda:1", "cuda:2", "cuda:3"});
  }
  CHECK_THROWS_WITH(Placement(roles, pools, gpu, ClusterSection{}, 3),
                    Catch::Contains("trainer.device") && Catch::Contains("pool 'rollout' needs 2 GPU(s)") &&
                        Catch::Contains("pool 'global' holds cuda:0, cuda:1"));
  gpu.device = "auto";  // the pools together do not fit: every pool on the CPU
  Placement placement(roles, pools, gpu, ClusterSection{}, 3);
  CHECK(devices(placement, "rollout") == std::vector<std::string>{"cpu", "cpu"});
  CHECK(devices(placement, "actor") == std::vector<std::string>{"cpu", "cpu"});
}

TEST_CASE("nccl_timeout: the actor's is its worker group's, the reward model's copy, and the critic's must match") {
  TempDir dir("seams_nccl_timeout");
  const PPOConfig cfg = read_ppo_config(with({"--actor_rollout_ref.nccl_timeout=1200"}, dir.path));
  const auto roles = ppo_roles(cfg, /*total_steps=*/2);
  auto role = [&](const std::string& name) {
    for (const auto& r : roles)
      if (r.name == name) return r.init_args.at("config");
    FAIL("no role " << name);
    return Json();
  };
  CHECK(workers::parse_actor_rollout_ref_config(role("actor_rollout_ref")).nccl_timeout == 1200);
  CHECK(role("rm").at("nccl_timeout") == 1200);  // the reward model is off here: its subtree is not parsed
  CHECK(workers::parse_actor_rollout_ref_config(role("rollout")).nccl_timeout == 1200);
  CHECK(workers::ActorRolloutRefConfig{}.nccl_timeout == 600);  // verl's default
  // the critic shares the actor's workers: a different value is refused when the config is read
  CHECK_THROWS_WITH(
      read_ppo_config(
          with({"--algorithm.adv_estimator=gae", "--actor_rollout_ref.nccl_timeout=1200", "--critic.nccl_timeout=900"},
               dir.path)),
      Catch::Contains("'critic.nccl_timeout' is 900 s") && Catch::Contains("'actor_rollout_ref.nccl_timeout' 1200 s"));
  const PPOConfig gae = read_ppo_config(
      with({"--algorithm.adv_estimator=gae", "--actor_rollout_ref.nccl_timeout=900", "--critic.nccl_timeout=900"},
           dir.path));
  CHECK(workers::parse_critic_config(ppo_roles(gae, 2).at(1).init_args.at("config")).nccl_timeout == 900);
  CHECK_THROWS_WITH(read_ppo_config(with({"--actor_rollout_ref.nccl_timeout=0"}, dir.path)),
                    Catch::Contains("actor_rollout_ref.nccl_timeout") && Catch::Contains(">= 1"));
}

TEST_CASE("data.apply_chat_template_kwargs reaches the agent rollout through the rollout section") {
  TempDir dir("seams_chat_kwargs");
  const PPOConfig cfg = read_ppo_config(with({"--data.apply_chat_template_kwargs.default_system=Call it.",
                                              "--data.apply_chat_template_kwargs.list_tools=false"},
                                             dir.path));
  const Json arr = ppo_roles(cfg, /*total_steps=*/2).at(0).init_args.at("config");
  (void)workers::parse_actor_rollout_ref_config(arr);  // the worker takes the copied section
  const agents::ChatTemplateKwargs kwargs = agents::parse_chat_template_kwargs(arr.at("rollout"));
  CHECK(kwargs.default_system == std::optional<std::string>("Call it."));
  CHECK(!kwargs.list_tools);
  const Json plain = ppo_roles(read_ppo_config(with({}, dir.path)), 2).at(0).init_args.at("config");
  CHECK(!agents::parse_chat_template_kwargs(plain.at("rollout")).default_system);
  CHECK(agents::parse_chat_template_kwargs(plain.at("rollout")).list_tools);
  CHECK_THROWS_WITH(read_ppo_config(with({"--data.apply_chat_template_kwargs.enable_thinking=false"}, dir.path)),
                    Catch::Contains("data.apply_chat_template_kwargs.enable_thinking"));
}

TEST_CASE("a trainer loop of its own (best-of-n rejection sampling) on the public pieces, without ppo_trainer.cpp") {
  TempDir dir("seams_loop");
  const Config config = with({"--trainer.logger=['jsonl']", "--actor_rollout_ref.actor.use_kl_loss=false"}, dir.path);
  const PPOConfig cfg = read_ppo_config(config);
  // the role table: only the policy (actor + rollout), no reference, critic or reward model
  auto roles = ppo_roles(cfg, /*total_steps=*/2);
  for (auto& role : roles) role.enabled = role.name == "actor_rollout_ref";
  roles.front().init_args["role"] = "actor_rollout";
  Placement placement(roles, {{.name = "global", .workers_per_node = {2}}}, cfg.trainer, cfg.cluster);
  WorkerGroup& policy = placement.group("actor_rollout_ref");
  policy.call(&ActorRolloutRefWorker::init_model);

  auto tokenizer = load_tokenizer(cfg.actor_rollout_ref.at("model").at("path").get<std::string>());
  const SyntheticTask task{.task = "arithmetic", .size = 16, .max_operand = 9, .seed = 5};
  RLDataset data(load_samples("", task, "prompt"), tokenizer, {.max_prompt_length = cfg.data.max_prompt_length});
  RewardManager reward(tokenizer, {.compute_score = "default", .max_response_length = cfg.data.max_response_length});
  tracking::Tracking tracker(
      cfg.trainer.logger,
      {.local_dir = dir.path.string(), .metrics_file = (dir.path / "loop.jsonl").string(), .total_steps = 2});
  for (int64_t step = 1; step <= 2; ++step) {
    DataProto batch = data.batch({0, 1, 2, 3});
    DataProto gen = batch.pop({"input_ids", "attention_mask", "position_ids"}).repeat(2, /*interleave=*/true);
    DataProto rollout = policy.call(&ActorRolloutRefWorker::generate_sequences, gen);
    rollout.union_with(batch.repeat(2, /*interleave=*/true));
    const at::Tensor scores = reward(rollout).reward_tensor.sum(-1);
    // keep every sample as a positive example weighted by its score (rejection sampling's filter,
    // soft): advantages are the score on each response token
    rollout.batch.set("advantages", scores.unsqueeze(1) * rollout.batch.at("response_mask"));
    DataProto old = policy.call(&ActorRolloutRefWorker::compute_log_prob, rollout);
    rollout.batch.set("old_log_probs", old.batch.at("old_log_probs"));
    DataProto out = policy.call(&ActorRolloutRefWorker::update_actor, rollout);
    tracker.log({{"train/score", scores.mean().item<double>()}}, step);
    CHECK(out.meta_info.at("metrics").contains("actor/pg_loss"));
  }
  tracker.close();
  std::ifstream in(dir.path / "loop.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  CHECK(lines == 2);
}
