#include <hyflow/serve/tool_call_parser.hpp>

#include <hyflow/core/text.hpp>

namespace hyflow::serve {

ParsedOutput parse_tool_calls(const std::string& text) {
  static const std::string open = "<tool_call>", close = "</tool_call>";
  ParsedOutput whole{.content = text, .tool_calls = {}};
  ParsedOutput out;
  size_t at = 0;
  while (true) {
    const size_t start = text.find(open, at);
    out.content += text.substr(at, start == std::string::npos ? std::string::npos : start - at);
    if (start == std::string::npos) break;
    const size_t body = start + open.size();
    const size_t end = text.find(close, body);
    if (end == std::string::npos) return whole;
    const auto call = nlohmann::ordered_json::parse(text.substr(body, end - body), nullptr, false);
    if (call.is_discarded() || !call.is_object() || !call.contains("name") || !call.at("name").is_string()) {
      return whole;
    }
    nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
    if (call.contains("arguments")) {
      arguments = call.at("arguments");
      if (arguments.is_string()) {
        arguments = nlohmann::ordered_json::parse(arguments.get<std::string>(), nullptr, false);
      }
      if (arguments.is_discarded() || !arguments.is_object()) return whole;
    }
    out.tool_calls.push_back({.name = call.at("name").get<std::string>(),
                              .arguments = arguments.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
    at = end + close.size();
  }
  if (out.tool_calls.empty()) return whole;
  out.content = trim(out.content);
  return out;
}

}  // namespace hyflow::serve
