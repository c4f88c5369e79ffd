#include <hyflow/agents/interaction.hpp>
#include <hyflow/agents/tool.hpp>
#include <hyflow/core/error.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <mutex>

using namespace hyflow;
using namespace hyflow::agents;

namespace {

// A tool that counts calls per instance and rewards the third call.
class CountingTool final : public Tool {
 public:
  using Tool::Tool;
  ToolResult execute(const std::string& instance_id, const nlohmann::json& arguments) override {
    std::lock_guard lock(mu_);
    int calls = ++calls_[instance_id];
    return {.text = arguments.value("say", std::string{}) + "#" + std::to_string(calls)};
  }
  double calc_reward(const std::string& instance_id) override {
    std::lock_guard lock(mu_);
    return calls_[instance_id] >= 3 ? 1.0 : 0.0;
  }
  void release(const std::string& instance_id) override {
    std::lock_guard lock(mu_);
    calls_.erase(instance_id);
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> calls_;
};

}  // namespace

TEST_CASE("tool schemas round-trip OpenAI's function shape and name what is wrong", "[agents]") {
  nlohmann::json openai = {{"type", "function"},
                           {"function",
                            {{"name", "calc"},
                             {"description", "exact arithmetic"},
                             {"parameters", {{"type", "object"}, {"properties", {{"expr", {{"type", "string"}}}}}}}}}};
  ToolSchema schema = ToolSchema::from_openai(openai);
  CHECK(schema.name == "calc");
  CHECK(schema.to_openai() == openai);
  CHECK_THROWS_WITH(ToolSchema::from_openai({{"type", "function"}}), Catch::Contains("tool_schema.function"));
  CHECK_THROWS_WITH(ToolSchema::from_openai({{"type", "retrieval"}, {"function", {{"name", "x"}}}}),
                    Catch::Contains("tool_schema.type"));
  CHECK_THROWS_WITH(ToolSchema::from_openai({{"function", {{"name", 3}}}}), Catch::Contains("'name'"));
}

TEST_CASE("tools are built by class name and keep per-instance state", "[agents]") {
  register_tool("test.CountingTool", [](const nlohmann::json&, ToolSchema schema) {
    return std::make_unique<CountingTool>(std::move(schema));
  });
  CHECK(has_tool("test.CountingTool"));
  auto tool = make_tool("test.CountingTool", nlohmann::json::object(), ToolSchema{.name = "count"});
  CHECK(tool->schema().name == "count");
  for (int i = 0; i < 3; ++i) CHECK(tool->execute("a", {{"say", "hi"}}).text == "hi#" + std::to_string(i + 1));
  CHECK(tool->execute("b", nlohmann::json::object()).text == "#1");
  CHECK(tool->calc_reward("a") == 1.0);
  CHECK(tool->calc_reward("b") == 0.0);
  tool->release("a");
  CHECK(tool->calc_reward("a") == 0.0);
  CHECK_THROWS_AS(make_tool("test.CountingToo", nlohmann::json::object(), ToolSchema{.name = "x"}), KeyError);
  CHECK_THROWS_WITH(make_tool("test.CountingToo", nlohmann::json::object(), ToolSchema{.name = "x"}),
                    Catch::Contains("test.CountingTool"));
  CHECK_THROWS_AS(register_tool("test.Null", nullptr), ValueError);
}

TEST_CASE("interactions are built by class name", "[agents]") {
  class Echo final : public Interaction {
   public:
    using Interaction::Interaction;
    void start(const std::string&, const nlohmann::json&) override {}
    InteractionTurn respond(const std::string&, const ChatMessages& messages) override {
      return {.terminate = messages.size() > 2, .text = "again"};
    }
    double score(const std::string&) override { return 0.5; }
    void finalize(const std::string&) override {}
  };
  register_interaction("test.Echo", [](const std::string& name, const nlohmann::json&) {
    return std::make_unique<Echo>(name);
  });
  auto interaction = make_interaction("test.Echo", "echo", nlohmann::json::object());
  CHECK(interaction->name() == "echo");
  CHECK_FALSE(interaction->respond("i", nlohmann::json::array({{{"role", "user"}}})).terminate);
  CHECK_THROWS_AS(make_interaction("test.Ech", "x", nlohmann::json::object()), KeyError);
}
