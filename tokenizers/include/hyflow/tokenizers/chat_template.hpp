#pragma once
// Chat templates of the ChatML family (kQwen2_5, kChatML) and the Llama 3 family (kLlama3_1, kLlama3).
// ChatML: <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
// kQwen2_5 renders exactly what the Jinja chat_template of Qwen2.5's tokenizer_config.json
// renders (tested against Jinja2's output): the system turn it always opens with, non-first
// system messages, consecutive `tool` messages in one user turn of <tool_response> blocks,
// assistant tool calls, and a tools list. kChatML is plain ChatML (no inserted system turn).
// kLlama3_1 renders exactly what the Jinja chat_template of Llama 3.1 Instruct's tokenizer_config.json
// renders (tested against Jinja2's output), <|begin_of_text|> included:
//   <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n
//   Today Date: {date}\n\n{system}<|eot_id|>... <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
// with contents trimmed like Python's str.strip(), tools (in the first user turn or the system turn),
// single tool calls as JSON or, for built-in tools, <|python_tag|>name.call(...)<|eom_id|>, and
// tool/ipython results as JSON strings. kLlama3 renders Llama 3 Instruct's template exactly: the same
// turns, <|begin_of_text|> before the first, nothing else (no system turn of its own, no tools).

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace hyflow::tokenizers {

/// A function call of an assistant message: rendered (kQwen2_5) as
/// <tool_call>\n{"name": ..., "arguments": json.dumps(arguments)}\n</tool_call>, (kLlama3_1) as
/// {"name": ..., "parameters": json.dumps(arguments)} or a built-in tool's <|python_tag|> call.
struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  ///< key order is kept
};

struct ChatMessage {
  std::string role;  ///< "system", "user", "assistant" or "tool" ("ipython" too for kLlama3_1)
  std::string content;
  std::vector<ToolCall> tool_calls = {};  ///< assistant messages (kQwen2_5; kLlama3_1: exactly one)
};

enum class ChatTemplate {
  kQwen2_5,   ///< Qwen2.5's template
  kChatML,    ///< plain ChatML: each message one turn; `tool` is a turn of its own
  kLlama3_1,  ///< Llama 3.1 Instruct's template
  kLlama3,    ///< Llama 3 Instruct's template: a trimmed turn per message, no date lines, no tools
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;  ///< end with the assistant header
  /// The system turn when the conversation does not start with one. kQwen2_5: replaces the
  /// template's "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."; kChatML:
  /// inserted only when set (kLlama3 too); kLlama3_1: the text after the date lines (the template's is empty).
  std::optional<std::string> default_system;
  ChatTemplate chat_template = ChatTemplate::kQwen2_5;
  /// Function schemas. kQwen2_5: listed in the system turn as json.dumps of each; kLlama3_1: as
  /// json.dumps(indent=4) of each, in the first user turn or (tools_in_user_message false) the system turn.
  /// Empty means no tools (for kLlama3_1 the template's `tools=none`).
  std::vector<nlohmann::ordered_json> tools = {};
  /// kLlama3_1: the template's date_string, the "Today Date: " line of the system turn.
  std::string date_string = "26 Jul 2024";
  /// kLlama3_1: the template's tools_in_user_message; the tools open the first turn after the
  /// system turn (whatever its role), which then must exist.
  bool tools_in_user_message = true;
  /// kLlama3_1: the template's builtin_tools (e.g. "brave_search", "wolfram_alpha", "code_interpreter").
  /// Set (even empty): "Environment: ipython" and a "Tools: " line, calls of these tools as
  /// <|python_tag|>name.call(arg="value", ...) and every tool-call turn ends with <|eom_id|>.
  std::optional<std::vector<std::string>> builtin_tools;
};

/// Renders messages. Unknown roles, tool calls outside assistant messages, tools with kChatML or kLlama3,
/// an empty conversation (kQwen2_5, kLlama3_1) and (kLlama3_1) a tool-call message with other than
/// one call, a built-in tool call whose arguments are not an object of strings, or tools in the
/// user turn with no turn left for them raise hyflow::ValueError naming the message.
std::string apply_chatml(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options = {});

/// JSON as Python's json.dumps(value, ensure_ascii=False, indent=indent) writes it (the templates'
/// tojson): ", " (indent: "," and a new line) and ": " separators, key order kept, floats as Python's repr.
std::string python_json_dumps(const nlohmann::ordered_json& value, std::optional<int> indent = std::nullopt);

/// s without leading and trailing whitespace as Python's str.strip() (Jinja's trim) sees it: ASCII
/// whitespace, U+001C..U+001F, U+0085, U+00A0 and the Unicode space separators (U+1680, U+2000..U+200A,
/// U+2028, U+2029, U+202F, U+205F, U+3000). s is UTF-8.
std::string python_strip(const std::string& s);

}  // namespace hyflow::tokenizers
