// Black-box agents against an in-process rollout server on the tiny model: the recorded
// trajectories are token-exact and complete (every sampled token, mask 1 exactly on them), the
// agent's rewards are taken or left to the reward function, and the timeout kills the agent's
// whole process group. The Python agent needs only the standard library; the JavaScript example
// (examples/agents/calculator_agent.mjs, the official `openai` client) runs under
// tests/common/with_openai_npm.sh ("[npm]", skipped when the npm registry is unreachable).
#include "common/processes.hpp"
#include "serve/serve_fixture.hpp"

#include <hyflow/agents/external_agent.hpp>
#include <hyflow/core/error.hpp>

#include <catch2/catch.hpp>

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>

using namespace hyflow;
using namespace hyflow::agents;

namespace {

using hyflow::testing::processes_with;

std::vector<nlohmann::json> arithmetic_rows(int n) {
  std::vector<nlohmann::json> rows;
  for (int i = 0; i < n; ++i) {
    const int a = 1000 + 37 * i, b = 2000 + 91 * i;
    rows.push_back({{"messages", {{{"role", "user"}, {"content", std::to_string(a) + "*" + std::to_string(b) + "="}}}},
                    {"ground_truth", std::to_string(int64_t{a} * b)}});
  }
  return rows;
}

std::vector<std::string> ids_for(const std::string& prefix, size_t n) {
  std::vector<std::string> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(prefix + "-" + std::to_string(i));
  return ids;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

/// Every turn of every session is in the batch exactly as the engine saw and produced it: some row
/// of its session starts with the turn's prompt + completion (unpadded), with response_mask 1 and
/// the sampled log-probs on the completion; and the rows hold no other mask-1 token.
void check_token_exact(const ExternalAgentResult& result) {
  const auto& batch = result.batch;
  const auto& sessions = batch.non_tensor_batch.at("session_id");
  const int64_t P = batch.batch["prompts"].size(1);
  CHECK(torch::equal(batch.batch["input_ids"], torch::cat({batch.batch["prompts"], batch.batch["responses"]}, 1)));
  int64_t sampled = 0, masked_one = batch.batch["response_mask"].sum().item<int64_t>();
  for (const auto& session : result.sessions) {
    for (const auto& turn : session.turns) {
      sampled += static_cast<int64_t>(turn.completion_ids.size());
      std::vector<int64_t> expected = turn.prompt_ids;
      expected.insert(expected.end(), turn.completion_ids.begin(), turn.completion_ids.end());
      bool found = false;
      for (int64_t b = 0; b < batch.size() && !found; ++b) {
        if (sessions[static_cast<size_t>(b)] != session.id) continue;
        auto attention = batch.batch["attention_mask"][b].to(torch::kBool);
        auto row = to_vector(batch.batch["input_ids"][b].masked_select(attention));
        if (row.size() < expected.size() || !std::equal(expected.begin(), expected.end(), row.begin())) continue;
        found = true;
        const int64_t pad = P - attention.slice(0, 0, P).sum().item<int64_t>();       // left padding of the prompt
        const int64_t from = static_cast<int64_t>(turn.prompt_ids.size()) + pad - P;  // into responses
        const auto n = static_cast<int64_t>(turn.completion_ids.size());
        CHECK(batch.batch["response_mask"][b].slice(0, from, from + n).sum().item<int64_t>() == n);
        auto log_probs = batch.batch["rollout_log_probs"][b].slice(0, from, from + n);
        CHECK(torch::equal(log_probs, torch::tensor(turn.completion_log_probs, torch::kFloat)));
      }
      INFO("session " << session.id);
      CHECK(found);
    }
  }
  CHECK(masked_one == sampled);
}

ExternalAgentOptions python_agent(const std::string& mode, const testing::ServedTiny& served, double timeout = 120) {
  return {.command = {"/usr/bin/python3", AGENTS_TEST_DIR "/python_agent.py", mode},
          .timeout_seconds = timeout,
          .pad_token_id = served.tokenizer->pad_token_id()};
}

}  // namespace

TEST_CASE("a black-box agent's sessions come back token-exact with its rewards", "[agents][external]") {
  testing::ServedTiny served;
  ExternalAgentRunner runner(*served.server, python_agent("solve", served));
  auto rows = arithmetic_rows(3);
  auto ids = ids_for("py", rows.size());
  auto result = runner.run(rows, ids);
  INFO(result.log_tail);
  REQUIRE(result.exit_code == 0);
  CHECK_FALSE(result.timed_out);
  CHECK(result.missing_sessions.empty());
  REQUIRE(result.sessions.size() == 3);
  for (const auto& session : result.sessions) CHECK(session.turns.size() == 2);
  // A second request whose re-rendered history extends the first turn's tokens chains into its row;
  // one that does not (the model ended on its end token, which the template renders as text)
  // starts a row of its own. Either way every sampled token is there once, with mask 1.
  REQUIRE(result.batch.size() >= 3);
  check_token_exact(result);
  const auto& row_index = result.batch.non_tensor_batch.at("row_index");
  const auto& agent_reward = result.batch.non_tensor_batch.at("agent_reward");
  for (size_t b = 0; b < static_cast<size_t>(result.batch.size()); ++b) {
    const auto id = result.batch.non_tensor_batch.at("session_id")[b].get<std::string>();
    CHECK(ids[row_index[b].get<size_t>()] == id);
    if (id == ids.back())
      CHECK(agent_reward[b].is_null());  // left to the reward function
    else
      CHECK(agent_reward[b] == result.rewards.at(id));
  }
  CHECK(result.rewards.size() == 2);
  REQUIRE(result.problems.size() == 1);
  CHECK_THAT(result.problems[0], Catch::Contains("unknown session id 'nobody'"));
  CHECK(served.server->sessions().ids().empty());  // collected, not left behind
}

TEST_CASE("a black-box agent past its timeout is killed with its process group", "[agents][external]") {
  testing::ServedTiny served;
  const std::string marker = "hyflow-agent-hang-" + std::to_string(::getpid());
  auto options = python_agent("hang", served, 3.0);
  options.command.push_back(marker);
  ExternalAgentRunner runner(*served.server, options);
  auto rows = arithmetic_rows(2);
  auto result = runner.run(rows, ids_for("hang", rows.size()));
  INFO(result.log_tail);
  CHECK(result.timed_out);
  CHECK(result.signal == SIGKILL);
  CHECK(result.wall_seconds >= 3.0);
  CHECK(result.wall_seconds < 10.0);
  CHECK_THAT(result.log_tail, Catch::Contains("hanging"));
  // What it recorded before the timeout is still collected; the other prompt has no session.
  CHECK(result.sessions.size() == 1);
  CHECK(result.missing_sessions == std::vector<std::string>{"hang-1"});
  CHECK(result.batch.size() == 1);
  for (int i = 0; i < 200 && processes_with(marker) > 0; ++i) ::usleep(10000);
  CHECK(processes_with(marker) == 0);
}

TEST_CASE("the runner names what is wrong with its arguments", "[agents][external]") {
  testing::ServedTiny served;
  CHECK_THROWS_AS(ExternalAgentRunner(*served.server, {}), ValueError);
  CHECK_THROWS_AS(ExternalAgentRunner(*served.server, {.command = {"true"}, .timeout_seconds = 0}), ValueError);
  ExternalAgentRunner runner(*served.server, {.command = {"true"}});
  auto rows = arithmetic_rows(2);
  CHECK_THROWS_WITH(runner.run(rows, {"a"}), Catch::Contains("2 rows but 1 session ids"));
  CHECK_THROWS_WITH(runner.run(rows, {"a", "a"}), Catch::Contains("'a'"));
  auto result = runner.run(rows, {"a", "b"});
  CHECK(result.exit_code == 0);
  CHECK(result.batch.size() == 0);
  CHECK(result.missing_sessions == std::vector<std::string>{"a", "b"});
  ExternalAgentRunner missing(*served.server, {.command = {"no-such-agent-program-hyflow"}});
  CHECK_THROWS_WITH(missing.run(rows, {"a", "b"}), Catch::Contains("no-such-agent-program-hyflow"));
}

TEST_CASE("the JavaScript example agent (openai npm client) through the server", "[.npm][agents][external]") {
  const char* module_dir = std::getenv("OPENAI_MODULE_DIR");  // NOLINT(concurrency-mt-unsafe)
  REQUIRE(module_dir != nullptr);
  testing::ServedTiny served({.token = "agent-test-key"});
  ExternalAgentRunner runner(*served.server,
                             {.command = {"node", HYFLOW_SOURCE_DIR "/examples/agents/calculator_agent.mjs"},
                              .timeout_seconds = 120,
                              .api_key = "agent-test-key",
                              .pad_token_id = served.tokenizer->pad_token_id(),
                              .env = {{"AGENT_MAX_TURNS", "2"}, {"AGENT_MAX_TOKENS", "16"}}});
  auto rows = arithmetic_rows(4);
  auto ids = ids_for("js", rows.size());
  auto result = runner.run(rows, ids);
  INFO(result.log_tail);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.log_tail, Catch::Contains("solved 4 prompts"));
  CHECK(result.missing_sessions.empty());
  REQUIRE(result.sessions.size() == 4);
  for (const auto& session : result.sessions) {
    CHECK(session.turns.size() >= 1);
    CHECK(session.turns.size() <= 2);
  }
  CHECK(result.rewards.size() == 4);
  CHECK(result.problems.empty());
  check_token_exact(result);
}
