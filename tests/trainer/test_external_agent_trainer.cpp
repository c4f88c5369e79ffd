// The trainer with a black-box agent (actor_rollout_ref.rollout.agent.external_command): a short
// GRPO run on the tiny chat model whose rollouts are the sessions of blackbox_agent.py (two turns
// per prompt, a tool message between) through the trainer's router over two rollout ranks. The
// rows trained on (each step's trajectories.jsonl, kept by external_keep_files) are checked token
// for token against what the agent saw; a killed, a hanging and a failing agent are checked too.
#include "common/processes.hpp"
#include "common/tiny_model.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/trainer/config.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

using namespace hyflow;
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

using hyflow::testing::processes_with;

/// A random 1-layer model with the chat character tokenizer and room for two chat turns.
const fs::path& chat_model() {
  static testing::TempDir dir("external_agent_model");
  static bool done = [] {
    const tokenizers::CharTokenizer tok(tokenizers::chat_char_options());
    testing::TinyShape shape;
    shape.vocab_size = tok.vocab_size();
    shape.num_hidden_layers = 1;
    shape.max_position_embeddings = 1024;
    shape.eos_token_id = tok.eos_token_id();
    shape.pad_token_id = tok.pad_token_id();
    testing::write_tiny_model(testing::tiny_model_config(shape), 3, dir.path);
    trainer::save_char_tokenizer_config(dir.path.string(), tokenizers::chat_char_options());
    return true;
  }();
  (void)done;
  return dir.path;
}

/// blackbox_agent.py with `args`
Json python_agent(const std::vector<std::string>& args) {
  Json argv = {"/usr/bin/python3", TRAINER_TEST_DIR "/blackbox_agent.py"};
  for (const auto& a : args) argv.push_back(a);
  return argv;
}

trainer::Config agent_config(const fs::path& out, const Json& argv, int64_t ranks, int64_t steps,
                             const std::vector<std::string>& extra = {}) {
  trainer::Config c;
  std::vector<std::string> args = {"--algorithm.adv_estimator=grpo",
                                   "--actor_rollout_ref.model.path=" + chat_model().string(),
                                   "--data.max_prompt_length=8",
                                   "--data.max_response_length=64",
                                   "--data.train_batch_size=2",
                                   "--data.synthetic.train_size=16",
                                   "--data.synthetic.val_size=2",
                                   "--data.synthetic.max_operand=9",
                                   "--actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                   "--actor_rollout_ref.actor.optim.lr=1e-3",
                                   "--actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                   "--actor_rollout_ref.actor.use_kl_loss=true",
                                   "--actor_rollout_ref.rollout.n=2",
                                   "--actor_rollout_ref.rollout.name=server",
                                   "--actor_rollout_ref.rollout.prompt_length=256",
                                   "--actor_rollout_ref.rollout.agent.external_command=" + argv.dump(),
                                   "--actor_rollout_ref.rollout.agent.external_keep_files=true",
                                   "--trainer.n_gpus_per_node=" + std::to_string(ranks),
                                   "--trainer.total_training_steps=" + std::to_string(steps),
                                   "--trainer.test_freq=-1",
                                   "--trainer.val_before_train=false",
                                   "--trainer.logger=['jsonl']",
                                   "--trainer.default_local_dir=" + out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  c.apply_arguments(args);
  return c;
}

std::vector<Json> json_lines(const fs::path& path) {
  std::vector<Json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(Json::parse(line));
  return out;
}

/// Every trajectories.jsonl under {out}/external_agent/<batch>/, by generation batch.
std::map<std::string, std::vector<Json>> trained_rows(const fs::path& out) {
  std::map<std::string, std::vector<Json>> rows;
  for (const auto& batch : fs::directory_iterator(out / "external_agent"))
    for (const auto& run : fs::directory_iterator(batch.path()))
      for (const auto& row : json_lines(run.path() / "trajectories.jsonl"))
        rows[batch.path().filename().string()].push_back(row);
  return rows;
}

std::vector<int64_t> ids(const Json& j) {
  return j.get<std::vector<int64_t>>();
}

}  // namespace

TEST_CASE("GRPO on a black-box agent's sessions: the rows trained on are the turns it saw, token for token") {
  testing::TempDir out("external_agent_trainer");
  const fs::path record = out.path / "agent_record.jsonl";
  trainer::PPOTrainer t(agent_config(out.path, python_agent({"solve", record.string()}), /*ranks=*/2, /*steps=*/2));
  t.init_workers();
  t.fit();

  // what the agent saw, by session: each turn's prompt ids, sampled ids and their log-probs
  std::map<std::string, std::vector<Json>> turns;
  for (const auto& turn : json_lines(record)) turns[turn.at("session_id").get<std::string>()].push_back(turn);
  REQUIRE(turns.size() == 8);  // 2 steps x 2 prompts x 2 samples
  for (const auto& [id, list] : turns) CHECK(list.size() == 2);

  const auto rows = trained_rows(out.path);
  REQUIRE(rows.size() == 2);  // the generation batches s1 and s2
  int64_t trained = 0;
  for (const auto& m : t.history()) {
    INFO(m.dump());
    const auto step = m.at("step").get<int64_t>();
    ++trained;
    const std::string name = "s" + std::to_string(step);
    REQUIRE(rows.count(name));
    const auto& batch = rows.at(name);
    CHECK(m.at("agent/external/sessions") == 4.0);
    CHECK(m.at("agent/external/missing_sessions") == 0.0);
    CHECK(m.at("agent/external/timed_out") == 0.0);
    CHECK(m.at("agent/external/exit_code") == 0.0);
    CHECK(m.at("agent/external/rewards_given") == 2.0);
    CHECK(m.at("agent/external/rows").get<double>() == static_cast<double>(batch.size()));
    const bool all_rows = m.at("agent/external/rows_dropped") == 0.0;
    // the actor's log-probs of the batch trained on equal the engine's sampled ones: same ids, same positions
    CHECK(m.at("training/rollout_probs_diff_max").get<double>() < 1e-3);
    CHECK(m.at("agent/masked_token_fraction").get<double>() > 0.0);  // the tool turn between
    CHECK(m.at("num_turns/mean").get<double>() >= 2.0);
    // sample 0 of each prompt: the agent's 2.5; sample 1: the reward function's (0 or 1)
    CHECK(m.at("critic/score/max").get<double>() == Approx(2.5));
    CHECK(std::isfinite(m.at("actor/pg_loss").get<double>()));

    std::map<std::string, int64_t> matched;  // turns found in a row, by session
    for (const auto& row : batch) {
      const auto id = row.at("session_id").get<std::string>();
      INFO("session " << id);
      REQUIRE(turns.count(id));
      auto full = ids(row.at("prompt_ids"));
      const auto P = static_cast<int64_t>(full.size());
      const auto response = ids(row.at("response_ids"));
      full.insert(full.end(), response.begin(), response.end());
      std::vector<int64_t> mask(response.size(), 0);
      std::vector<double> log_probs(response.size(), 0.0);
      size_t end = 0;
      for (const auto& turn : turns.at(id)) {
        auto expected = ids(turn.at("prompt_ids"));
        const auto from = static_cast<int64_t>(expected.size()) - P;  // where its completion starts in the response
        const auto completion = ids(turn.at("completion_ids"));
        expected.insert(expected.end(), completion.begin(), completion.end());
        if (from < 0 || expected.size() > full.size() || !std::equal(expected.begin(), expected.end(), full.begin()))
          continue;
        ++matched[id];
        end = std::max(end, expected.size());
        for (size_t k = 0; k < completion.size(); ++k) {
          mask[static_cast<size_t>(from) + k] = 1;
          log_probs[static_cast<size_t>(from) + k] = turn.at("log_probs").at(k).get<double>();
        }
      }
      // the row is its session's turns: ends with the last one, mask 1 exactly on the sampled ids
      CHECK(end == full.size());
      CHECK(ids(row.at("response_mask")) == mask);
      const auto got = row.at("rollout_log_probs").get<std::vector<double>>();
      REQUIRE(got.size() == log_probs.size());
      for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == Approx(log_probs[k]).margin(1e-6));
    }
    if (all_rows)  // every turn of the step's sessions is in the batch
      for (const auto& [id, list] : turns)
        if (id.find("-" + name + "-p") != std::string::npos) CHECK(matched[id] >= static_cast<int64_t>(list.size()));
  }
  CHECK(trained == 2);
}

TEST_CASE("a black-box agent that dies or hangs loses its missing sessions, the trainer trains on the rest") {
  SECTION("killed by a signal after one turn") {
    testing::TempDir out("external_agent_die");
    trainer::PPOTrainer t(agent_config(out.path, python_agent({"die", (out.path / "record.jsonl").string()}), 1, 2));
    t.init_workers();
    t.fit();
    REQUIRE(t.history().size() == 2);
    for (const auto& m : t.history()) {
      INFO(m.dump());
      CHECK(m.at("agent/external/sessions") == 1.0);
      CHECK(m.at("agent/external/missing_sessions") == 3.0);
      CHECK(m.at("agent/external/exit_code") == -1.0);
      CHECK(m.at("agent/external/rows") == 1.0);
      CHECK(std::isfinite(m.at("actor/pg_loss").get<double>()));
    }
  }
  SECTION("past its timeout: killed with its process group") {
    testing::TempDir out("external_agent_hang");
    const std::string marker = "hyflow-trainer-agent-hang-" + std::to_string(::getpid());
    trainer::PPOTrainer t(agent_config(out.path, python_agent({"hang", (out.path / "record.jsonl").string(), marker}),
                                       1, 1, {"--actor_rollout_ref.rollout.agent.external_timeout=2"}));
    t.init_workers();
    const auto start = std::chrono::steady_clock::now();
    t.fit();
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 30);
    REQUIRE(t.history().size() == 1);
    const auto& m = t.history().front();
    INFO(m.dump());
    CHECK(m.at("agent/external/timed_out") == 1.0);
    CHECK(m.at("agent/external/wall_s").get<double>() >= 2.0);
    CHECK(m.at("agent/external/sessions") == 1.0);
    CHECK(m.at("agent/external/missing_sessions") == 3.0);
    for (int i = 0; i < 200 && processes_with(marker) > 0; ++i) ::usleep(10000);
    CHECK(processes_with(marker) == 0);
  }
}

TEST_CASE("a black-box agent that records nothing stops the trainer with an error naming it and its log") {
  testing::TempDir out("external_agent_fail");
  trainer::PPOTrainer t(agent_config(out.path, python_agent({"fail", (out.path / "record.jsonl").string()}), 1, 1));
  t.init_workers();
  // the program, how it ended and what it printed
  CHECK_THROWS_WITH(t.fit(), Catch::Contains("blackbox_agent.py fail") && Catch::Contains("exited with code 3") &&
                                 Catch::Contains("agent gives up: no luck today"));
}

TEST_CASE("the black-box agent's keys are checked by name") {
  testing::TempDir out("external_agent_keys");
  auto c = agent_config(out.path, python_agent({"solve", "x"}), 1, 1, {"--actor_rollout_ref.rollout.name=hf"});
  CHECK_THROWS_WITH(trainer::PPOTrainer(c), Catch::Contains("rollout.name=server"));
  auto r = agent_config(out.path, python_agent({"solve", "x"}), 1, 1,
                        {"--actor_rollout_ref.rollout.agent.external_reward=judge"});
  CHECK_THROWS_WITH(trainer::PPOTrainer(r), Catch::Contains("external_reward"));
}

TEST_CASE("GRPO on the JavaScript example agent's sessions (openai npm client, tools)", "[.npm]") {
  REQUIRE(std::getenv("OPENAI_MODULE_DIR") != nullptr);  // NOLINT(concurrency-mt-unsafe)
  testing::TempDir out("external_agent_npm");
  const Json node = {"node", HYFLOW_SOURCE_DIR "/examples/agents/calculator_agent.mjs"};
  trainer::Config c = agent_config(out.path, node, 1, 2, {"--actor_rollout_ref.rollout.prompt_length=900"});
  trainer::PPOTrainer t(c);
  t.init_workers();
  t.fit();
  REQUIRE(t.history().size() == 2);
  for (const auto& m : t.history()) {
    INFO(m.dump());
    CHECK(m.at("agent/external/sessions") == 4.0);
    CHECK(m.at("agent/external/exit_code") == 0.0);
    CHECK(m.at("agent/external/rewards_given") == 4.0);  // one per prompt, 0 or 1
    CHECK(m.at("agent/external/agent_reward_fraction") == 1.0);
    CHECK(m.at("training/rollout_probs_diff_max").get<double>() < 1e-3);
    CHECK(std::isfinite(m.at("actor/pg_loss").get<double>()));
  }
}
