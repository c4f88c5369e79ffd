// The code-execution tool (config, answers as text, timeouts, concurrency bound), the built-in
// interaction (verl's gsm8k semantics) and tool plugins loaded from a shared library.
#include "sandbox_fixture.hpp"

#include <hyflow/agents/answer_check_interaction.hpp>
#include <hyflow/agents/code_tool.hpp>
#include <hyflow/agents/tool_plugins.hpp>
#include <hyflow/core/error.hpp>

#include <chrono>
#include <future>
#include <vector>

using namespace hyflow;
using namespace hyflow::agents;
using hyflow::agents::testing::sandbox_or_skip;

namespace {

nlohmann::json assistant_says(const std::string& text) {
  return nlohmann::json::array(
      {{{"role", "user"}, {"content", "What is 6*7?"}}, {{"role", "assistant"}, {"content", text}}});
}

}  // namespace

TEST_CASE("the code tool's config: verl's key names, limits, unknown keys named", "[agents][code_tool]") {
  auto o = CodeToolOptions::from_config({{"default_timeout", 2.5},
                                         {"memory_limit_mb", 128},
                                         {"num_workers", 2},
                                         {"default_language", "python"},
                                         {"cpu_seconds", 1},
                                         {"max_processes", 8},
                                         {"max_output_bytes", 1000},
                                         {"max_file_mb", 2},
                                         {"tmp_mb", 4}});
  CHECK(o.limits.wall_seconds == 2.5);
  CHECK(o.limits.memory_bytes == size_t{128} << 20);
  CHECK(o.num_workers == 2);
  CHECK(o.limits.cpu_seconds == 1);
  CHECK(o.limits.max_processes == 8);
  CHECK(o.limits.max_output_bytes == 1000);
  CHECK(o.limits.max_file_bytes == size_t{2} << 20);
  CHECK(o.limits.tmp_bytes == size_t{4} << 20);
  CHECK(CodeToolOptions::from_config(nlohmann::json::object()).limits.wall_seconds == SandboxLimits{}.wall_seconds);
  CHECK_THROWS_WITH(CodeToolOptions::from_config({{"sandbox_fusion_url", "http://x"}}),
                    Catch::Contains("'sandbox_fusion_url' is unknown"));
  CHECK_THROWS_WITH(CodeToolOptions::from_config({{"default_language", "javascript"}}),
                    Catch::Contains("default_language"));
  CHECK_THROWS_WITH(CodeToolOptions::from_config({{"num_workers", 0}}), Catch::Contains("'num_workers'"));
  CHECK_THROWS_WITH(CodeToolOptions::from_config({{"default_timeout", "10"}}), Catch::Contains("'default_timeout'"));
  CHECK(code_tool_schema().to_openai()["function"]["parameters"]["required"] == nlohmann::json::array({"code"}));
}

TEST_CASE("the code tool answers the model as text: output, errors, timeouts, truncation", "[agents][code_tool]") {
  if (!sandbox_or_skip()) return;
  register_code_tool();
  auto tool = make_tool(kCodeToolClass, {{"default_timeout", 2}, {"max_output_bytes", 1024}}, code_tool_schema());
  CHECK(tool->schema().name == "code_interpreter");

  auto r = tool->execute("a", {{"code", "print(1234 * 5678)"}});
  CHECK(r.status == ToolStatus::ok);
  CHECK(r.text == "7006652\n");
  CHECK(r.metrics["exit_code"] == 0);

  r = tool->execute("a", {{"code", "print('partial')\nraise ValueError('bad input')"}});
  CHECK(r.status == ToolStatus::error);
  CHECK_THAT(r.text, Catch::StartsWith("partial\n") && Catch::Contains("ValueError: bad input") &&
                         Catch::EndsWith("[exit status 1]"));

  r = tool->execute("a", {{"code", "import time\nprint('waiting', flush=True)\ntime.sleep(100)"}});
  CHECK(r.status == ToolStatus::timeout);
  CHECK(r.text == "waiting\n[killed: wall-time limit of 2 s]");
  CHECK(r.metrics["limit"] == "wall_time");

  r = tool->execute("a", {{"code", "print('x' * 100000)"}});
  CHECK(r.status == ToolStatus::error);
  CHECK_THAT(r.text, Catch::Contains("[stdout truncated at 1024 bytes]") &&
                         Catch::EndsWith("[killed: output over the limit of 1024 bytes]"));

  r = tool->execute("a", {{"source", "print(1)"}});
  CHECK(r.status == ToolStatus::error);
  CHECK_THAT(r.text, Catch::Contains("'code'"));
  r = tool->execute("a", {{"code", 42}});
  CHECK(r.status == ToolStatus::error);
}

TEST_CASE("the code tool runs at most num_workers programs at once", "[agents][code_tool]") {
  if (!sandbox_or_skip()) return;
  register_code_tool();
  auto tool = make_tool(kCodeToolClass, {{"num_workers", 1}, {"default_timeout", 20}}, code_tool_schema());
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::future<ToolResult>> calls;
  for (int i = 0; i < 3; ++i)
    calls.push_back(std::async(std::launch::async, [&, i] {
      return tool->execute(std::to_string(i), {{"code", "import time\ntime.sleep(0.4)\nprint('done')"}});
    }));
  for (auto& call : calls) CHECK(call.get().text == "done\n");
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= 1.2);
}

TEST_CASE("the built-in interaction: wrong answers get another try with the score so far", "[agents][interaction]") {
  register_builtin_interactions();
  CHECK(has_interaction(kAnswerCheckInteractionClass));
  auto interaction = make_interaction(kVerlGsm8kInteractionClass, "gsm8k", {{"max_turns", 3}});
  interaction->start("t1", {{"name", "gsm8k"}, {"ground_truth", "42"}});

  auto turn = interaction->respond("t1", assistant_says("I think it is 41.\n#### 41"));
  CHECK_FALSE(turn.terminate);
  CHECK(turn.score == 0.0);
  CHECK(turn.text == "Your answer is wrong, try again. Score so far: 0 (attempt 1 of 3).");
  turn = interaction->respond("t1", assistant_says("Sorry: #### 42"));
  CHECK(turn.terminate);
  CHECK(turn.score == 1.0);
  CHECK(interaction->score("t1") == 1.0);
  interaction->finalize("t1");
  CHECK_THROWS_AS(interaction->score("t1"), KeyError);

  // Out of turns: the conversation ends without another user message.
  auto short_one = make_interaction(kAnswerCheckInteractionClass, "check", {{"max_turns", 2}});
  short_one->start("t2", {{"ground_truth", "7"}});
  CHECK_FALSE(short_one->respond("t2", assistant_says("#### 6")).terminate);
  turn = short_one->respond("t2", assistant_says("#### 8"));
  CHECK(turn.terminate);
  CHECK(turn.text.empty());
  CHECK(short_one->score("t2") == 0.0);

  // The content-parts form of a message counts too.
  short_one->start("t3", {{"ground_truth", "7"}});
  nlohmann::json parts = {{{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "#### 7"}}}}}};
  CHECK(short_one->respond("t3", parts).terminate);

  CHECK_THROWS_WITH(make_interaction(kAnswerCheckInteractionClass, "x", {{"max_turn", 2}}),
                    Catch::Contains("'max_turn' is unknown"));
  CHECK_THROWS_WITH(short_one->start("t4", {{"answer", "7"}}), Catch::Contains("ground_truth"));
  CHECK_THROWS_AS(short_one->respond("nobody", assistant_says("#### 7")), KeyError);
}

TEST_CASE("tool plugins register their tools from a shared library", "[agents][plugins]") {
  CHECK_FALSE(has_tool("test.plugin.ReverseTool"));
  load_tool_plugins({TOOL_PLUGIN_PATH});
  REQUIRE(has_tool("test.plugin.ReverseTool"));
  auto tool = make_tool("test.plugin.ReverseTool", nlohmann::json::object(), ToolSchema{.name = "reverse"});
  CHECK(tool->execute("a", {{"text", "hyflow"}}).text == "wolfyh");
  CHECK_THROWS_AS(load_tool_plugins({"/nonexistent/libtool.so"}), ValueError);
  CHECK_THROWS_WITH(load_tool_plugins({"/nonexistent/libtool.so"}),
                    Catch::Contains("tool plugin") && Catch::Contains("/nonexistent/libtool.so"));
}
