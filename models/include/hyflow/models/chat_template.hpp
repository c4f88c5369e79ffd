#pragma once
// Chat templates of the ChatML family:
//   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
// kQwen2_5 renders exactly what the Jinja chat_template of Qwen2.5's tokenizer_config.json
// renders (tested against Jinja2's output): the system turn it always opens with, non-first
// system messages, consecutive `tool` messages in one user turn of <tool_response> blocks,
// assistant tool calls, and a tools list. kChatML is plain ChatML (no inserted system turn).

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace hyflow::models {

/// A function call of an assistant message: rendered as
/// <tool_call>\n{"name": ..., "arguments": json.dumps(arguments)}\n</tool_call>.
struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  ///< key order is kept
};

struct ChatMessage {
  std::string role;  ///< "system", "user", "assistant" or "tool"
  std::string content;
  std::vector<ToolCall> tool_calls = {};  ///< assistant messages (kQwen2_5)
};

enum class ChatTemplate {
  kQwen2_5,  ///< Qwen2.5's template
  kChatML,   ///< plain ChatML: each message one turn; `tool` is a turn of its own
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;  ///< end with the assistant header
  /// The system turn when the conversation does not start with one. kQwen2_5: replaces the
  /// template's "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."; kChatML:
  /// inserted only when set.
  std::optional<std::string> default_system;
  ChatTemplate chat_template = ChatTemplate::kQwen2_5;
  /// Function schemas (kQwen2_5), listed in the system turn as json.dumps of each.
  std::vector<nlohmann::ordered_json> tools = {};
};

/// Renders messages. Unknown roles, tool calls outside assistant messages, tools with kChatML
/// and (kQwen2_5) an empty conversation raise hyflow::ValueError naming the message.
std::string apply_chatml(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options = {});

/// JSON as Python's json.dumps(value, ensure_ascii=False) writes it (the templates' tojson):
/// ", " and ": " separators, key order kept, floats as Python's repr.
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace hyflow::models
