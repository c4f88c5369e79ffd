#pragma once
// The Hermes / Qwen2.5 tool-call format a model writes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
// blocks, any number, with text around them. Parsing never throws: output that is not a clean
// set of calls comes back as plain text (a malformed call is text, never a server error).

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace hyflow::serve {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  ///< the arguments object as a JSON string (OpenAI's function.arguments)
};

struct ParsedOutput {
  std::string content;                     ///< the text outside the blocks, trimmed (all of it when no calls)
  std::vector<ParsedToolCall> tool_calls;  ///< empty: no call, or a malformed one (then content is the whole text)
};

/// Splits model output into text and calls. Every block must close and hold a JSON object with a
/// string "name" and an object "arguments" (or a JSON string of one); otherwise no calls are returned.
ParsedOutput parse_tool_calls(const std::string& text);

}  // namespace hyflow::serve
