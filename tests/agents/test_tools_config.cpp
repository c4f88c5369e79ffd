#include <hyflow/agents/agent_config.hpp>
#include <hyflow/agents/calculator_tool.hpp>
#include <hyflow/core/error.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

using namespace hyflow;
using namespace hyflow::agents;
using Json = nlohmann::json;

namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("hyflow_agents_" + name);
  std::ofstream(path) << text;
  return path.string();
}

const char* kCalculatorYaml = R"(tools:
  - class_name: hyflow.tools.CalculatorTool
    config:
      type: native
      max_result_digits: 50
    tool_schema:
      type: function
      function:
        name: calculator
        description: exact arithmetic
        parameters:
          type: object
          properties:
            expression: {type: string}
          required: [expression]
)";

class EchoInteraction final : public Interaction {
 public:
  EchoInteraction(std::string name, Json config) : Interaction(std::move(name)), config_(std::move(config)) {}
  void start(const std::string&, const Json&) override {}
  InteractionTurn respond(const std::string&, const ChatMessages&) override { return {.text = config_.dump()}; }
  double score(const std::string&) override { return 0.0; }
  void finalize(const std::string&) override {}

 private:
  Json config_;
};

}  // namespace

TEST_CASE("the calculator is exact on integers of any size and on fractions", "[agents]") {
  CHECK(calculate("1234*5678") == "7006652");
  CHECK(calculate("  2 + 3 * (4 - 1) ") == "11");
  CHECK(calculate("-(7 - 10) * -2") == "-6");
  CHECK(calculate("10/4") == "5/2");
  CHECK(calculate("10/4*2") == "5");
  CHECK(calculate("123456789012345678901234567890 * 987654321098765432109876543210") ==
        "121932631137021795226185032733622923332237463801111263526900");
  CHECK(calculate("99999999999999999999 + 1") == "100000000000000000000");
}

TEST_CASE("bad expressions are errors that say what and where", "[agents]") {
  CHECK_THROWS_WITH(calculate("1/(2-2)"), Catch::Contains("division by zero"));
  CHECK_THROWS_WITH(calculate("1+*2"), Catch::Contains("offset 2"));
  CHECK_THROWS_WITH(calculate("(1+2"), Catch::Contains("expected ')'"));
  CHECK_THROWS_WITH(calculate("1+2)"), Catch::Contains("unexpected ')'"));
  CHECK_THROWS_WITH(calculate("2^3"), Catch::Contains("unexpected '^'"));
  CHECK_THROWS_WITH(calculate(""), Catch::Contains("ended"));
  CHECK_THROWS_WITH(calculate(std::string(2000, '1')), Catch::Contains("longer than 1000"));
  CHECK_THROWS_WITH(calculate("99999*99999", {.max_result_digits = 5}), Catch::Contains("more than 5 digits"));
  CHECK_THROWS_WITH(calculate(std::string(200, '(') + "1" + std::string(200, ')')), Catch::Contains("nesting"));
}

TEST_CASE("the calculator tool answers errors as text for the model", "[agents]") {
  register_calculator_tool();
  auto tool = make_tool(kCalculatorToolClass, Json::object(), calculator_schema());
  CHECK(tool->schema().to_openai()["function"]["name"] == "calculator");
  auto ok = tool->execute("i", {{"expression", "6*7"}});
  CHECK(ok.status == ToolStatus::ok);
  CHECK(ok.text == "42");
  auto bad = tool->execute("i", {{"expression", "6/0"}});
  CHECK(bad.status == ToolStatus::error);
  CHECK_THAT(bad.text, Catch::StartsWith("Error: division by zero"));
  auto missing = tool->execute("i", {{"expr", "1"}});
  CHECK(missing.status == ToolStatus::error);
  CHECK_THAT(missing.text, Catch::Contains("\"expression\""));
  CHECK_THROWS_WITH(make_tool(kCalculatorToolClass, {{"max_result_digits", 0}}, calculator_schema()),
                    Catch::Contains("config.max_result_digits"));
}

TEST_CASE("multi_turn keys have verl's defaults and name what is wrong", "[agents]") {
  MultiTurnConfig d = parse_multi_turn_config(Json::object());
  CHECK_FALSE(d.enable);
  CHECK_FALSE(d.max_assistant_turns);
  CHECK(d.max_parallel_calls == 1);
  CHECK(d.max_tool_response_length == 256);
  CHECK(d.tool_response_truncate_side == TruncateSide::middle);
  CHECK(parse_agent_config(Json::object()).default_agent_loop == "single_turn_agent");

  Json rollout = {{"multi_turn",
                   {{"enable", true},
                    {"max_assistant_turns", 3},
                    {"max_user_turns", nullptr},
                    {"max_parallel_calls", 2},
                    {"tool_response_truncate_side", "left"},
                    {"tool_plugins", {"libmy_tools.so"}},
                    {"tool_config_path", "tools.yaml"}}},
                  {"agent", {{"num_workers", 4}}}};
  MultiTurnConfig c = parse_multi_turn_config(rollout);
  CHECK(c.enable);
  CHECK(c.max_assistant_turns == 3);
  CHECK_FALSE(c.max_user_turns);
  CHECK(c.max_parallel_calls == 2);
  CHECK(c.tool_response_truncate_side == TruncateSide::left);
  CHECK(c.tool_config_path == "tools.yaml");
  CHECK(c.tool_plugins == std::vector<std::string>{"libmy_tools.so"});
  AgentConfig a = parse_agent_config(rollout);
  CHECK(a.num_workers == 4);
  CHECK(a.default_agent_loop == "tool_agent");

  CHECK_THROWS_WITH(parse_multi_turn_config({{"multi_turn", {{"max_turns", 3}}}}),
                    Catch::Contains("actor_rollout_ref.rollout.multi_turn.max_turns: unknown key"));
  CHECK_THROWS_WITH(parse_multi_turn_config({{"multi_turn", {{"max_parallel_calls", 0}}}}),
                    Catch::Contains("multi_turn.max_parallel_calls: expected an integer >= 1"));
  CHECK_THROWS_WITH(parse_multi_turn_config({{"multi_turn", {{"tool_response_truncate_side", "up"}}}}),
                    Catch::Contains("tool_response_truncate_side"));
  CHECK_THROWS_WITH(parse_multi_turn_config({{"multi_turn", {{"enable", "yes"}}}}), Catch::Contains("enable"));
  CHECK_THROWS_WITH(parse_multi_turn_config({{"multi_turn", {{"format", "llama3_json"}}}}), Catch::Contains("format"));
  CHECK_THROWS_WITH(parse_multi_turn_config({{"multi_turn", {{"tool_plugins", "a.so"}}}}),
                    Catch::Contains("multi_turn.tool_plugins: expected a list"));
  CHECK_THROWS_WITH(parse_multi_turn_config({{"multi_turn", {{"tool_plugins", {""}}}}}),
                    Catch::Contains("multi_turn.tool_plugins"));
  CHECK_THROWS_WITH(parse_agent_config({{"agent", {{"num_workers", -1}}}}),
                    Catch::Contains("actor_rollout_ref.rollout.agent.num_workers"));
}

TEST_CASE("tool responses are cut on the configured side", "[agents]") {
  CHECK(truncate_tool_response("abcdef", 6, TruncateSide::left) == "abcdef");
  CHECK(truncate_tool_response("abcdefgh", 4, TruncateSide::left) == "abcd...(truncated)");
  CHECK(truncate_tool_response("abcdefgh", 4, TruncateSide::right) == "(truncated)...efgh");
  CHECK(truncate_tool_response("abcdefgh", 4, TruncateSide::middle) == "ab\n...(truncated)...\ngh");
}

TEST_CASE("verl's tool config file builds the tools by class name", "[agents]") {
  const auto path = write_file("tools.yaml", kCalculatorYaml);
  auto tools = load_tool_config(path);
  REQUIRE(tools.size() == 1);
  auto& calc = *tools.at("calculator");
  CHECK(calc.schema().description == "exact arithmetic");
  CHECK(calc.schema().parameters["required"] == Json::array({"expression"}));
  CHECK(calc.execute("i", {{"expression", "2*3"}}).text == "6");
  // the config reached the factory: 50 digits at most
  CHECK(calc.execute("i", {{"expression", std::string(30, '9') + "*" + std::string(30, '9')}}).status ==
        ToolStatus::error);
}

TEST_CASE("the repository's calculator tool config loads", "[agents]") {
  auto tools = load_tool_config(std::string(HYFLOW_SOURCE_DIR) + "/config/tools/calculator.yaml");
  REQUIRE(tools.count("calculator") == 1);
  CHECK(tools.at("calculator")->execute("i", {{"expression", "(1234*5678)-9"}}).text == "7006643");
}

TEST_CASE("tool and interaction config errors name the file and the field", "[agents]") {
  CHECK_THROWS_WITH(load_tool_config("/nonexistent/tools.yaml"), Catch::Contains("/nonexistent/tools.yaml"));
  const auto bad_yaml = write_file("bad.yaml", "tools: [\n  - {class_name: x\n");
  CHECK_THROWS_WITH(load_tool_config(bad_yaml), Catch::Contains(bad_yaml + ":"));
  const auto no_list = write_file("nolist.yaml", "tool: []\n");
  CHECK_THROWS_WITH(load_tool_config(no_list), Catch::Contains("'tools' list"));
  const auto no_class = write_file("noclass.yaml", "tools:\n  - tool_schema: {function: {name: a}}\n");
  CHECK_THROWS_WITH(load_tool_config(no_class), Catch::Contains("tools[0].class_name"));
  const auto unknown =
      write_file("unknown.yaml", "tools:\n  - {class_name: my.Tool, tool_schema: {function: {name: a}}}\n");
  CHECK_THROWS_AS(load_tool_config(unknown), KeyError);
  CHECK_THROWS_WITH(load_tool_config(unknown), Catch::Contains("tools[0].class_name") && Catch::Contains("my.Tool"));
  const auto schema = write_file(
      "schema.yaml", "tools:\n  - {class_name: hyflow.tools.CalculatorTool, tool_schema: {function: {}}}\n");
  CHECK_THROWS_WITH(load_tool_config(schema), Catch::Contains("tools[0].tool_schema.function"));
  const auto twice =
      write_file("twice.yaml",
                 "tools:\n  - {class_name: hyflow.tools.CalculatorTool, tool_schema: {function: {name: c}}}\n"
                 "  - {class_name: hyflow.tools.CalculatorTool, tool_schema: {function: {name: c}}}\n");
  CHECK_THROWS_WITH(load_tool_config(twice), Catch::Contains("tools[1]") && Catch::Contains("second tool named 'c'"));

  register_interaction("test.Echo", [](const std::string& name, const Json& config) {
    return std::make_unique<EchoInteraction>(name, config);
  });
  const auto inter = write_file("inter.yaml",
                                "interaction:\n  - name: judge\n    class_name: test.Echo\n    config: {n: 2, q: 'x'}\n"
                                "  - class_name: test.Echo\n");
  auto interactions = load_interaction_config(inter);
  REQUIRE(interactions.size() == 2);
  CHECK(interactions.at("judge")->respond("i", Json::array()).text == R"({"n":2,"q":"x"})");
  CHECK(interactions.count("test.Echo") == 1);
  // the built-in classes need no registration by the caller: the loaders register them
  const auto builtins = write_file("builtins.yaml",
                                   "tools:\n  - class_name: hyflow.tools.CodeInterpreterTool\n"
                                   "    tool_schema: {function: {name: code_interpreter}}\n");
  CHECK(load_tool_config(builtins).count("code_interpreter") == 1);
  const auto checker = write_file(
      "checker.yaml", "interaction:\n  - {name: check, class_name: hyflow.interactions.AnswerCheckInteraction}\n");
  CHECK(load_interaction_config(checker).at("check")->name() == "check");
  const auto bad_inter = write_file("badinter.yaml", "interaction:\n  - {name: j, class_name: nope.Interaction}\n");
  CHECK_THROWS_WITH(load_interaction_config(bad_inter), Catch::Contains("interaction[0].class_name"));
}

TEST_CASE("the black-box agent keys (agent.external_*) are read and checked by name") {
  const ExternalAgentConfig off = parse_external_agent_config(Json::object());
  CHECK_FALSE(off.enabled());
  CHECK(off.timeout == 600.0);
  CHECK(off.reward == "agent");
  Json rollout = {{"agent",
                   {{"num_workers", 2},
                    {"external_command", {"node", "agent.mjs"}},
                    {"external_timeout", 30},
                    {"external_reward", "reward_fn"},
                    {"external_keep_files", true}}}};
  const ExternalAgentConfig x = parse_external_agent_config(rollout);
  CHECK(x.enabled());
  CHECK(x.command == std::vector<std::string>{"node", "agent.mjs"});
  CHECK(x.timeout == 30.0);
  CHECK(x.reward == "reward_fn");
  CHECK(x.keep_files);
  CHECK(parse_agent_config(rollout).num_workers == 2);  // the loops' reader accepts the external keys
  auto with = [](const char* key, Json value) { return Json{{"agent", {{key, std::move(value)}}}}; };
  CHECK_THROWS_WITH(parse_external_agent_config(with("external_command", "node agent.mjs")),
                    Catch::Contains("agent.external_command: expected a list"));
  CHECK_THROWS_WITH(parse_external_agent_config(with("external_command", {"node", 3})),
                    Catch::Contains("agent.external_command: 3 is not a string"));
  CHECK_THROWS_WITH(parse_external_agent_config(with("external_timeout", 0)), Catch::Contains("external_timeout"));
  CHECK_THROWS_WITH(parse_external_agent_config(with("external_reward", "judge")), Catch::Contains("'judge'"));
  CHECK_THROWS_WITH(parse_external_agent_config(with("external_cmd", Json::array())),
                    Catch::Contains("agent.external_cmd: unknown key"));
}
