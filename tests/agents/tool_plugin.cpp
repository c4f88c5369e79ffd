// A tool plugin for test_agents_tools: a shared library whose static initializer registers a
// tool class. It links none of hyflow's libraries; register_tool resolves in the test program.
#include <hyflow/agents/tool.hpp>

#include <memory>
#include <string>

namespace {

class ReverseTool final : public hyflow::agents::Tool {
 public:
  using Tool::Tool;
  hyflow::agents::ToolResult execute(const std::string&, const nlohmann::json& arguments) override {
    std::string text = arguments.value("text", std::string{});
    return {.text = std::string(text.rbegin(), text.rend())};
  }
};

const bool registered = [] {
  hyflow::agents::register_tool("test.plugin.ReverseTool",
                                [](const nlohmann::json&, hyflow::agents::ToolSchema schema) {
                                  return std::make_unique<ReverseTool>(std::move(schema));
                                });
  return true;
}();

}  // namespace
