#include <hyflow/models/chat_template.hpp>

#include <hyflow/core/error.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace hyflow::models {
namespace {

constexpr const char* kQwenSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

void append_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// Python's float repr: the shortest digits that round-trip; positional for exponents in
// [-4, 16), else d.ddde±XX; integral values keep ".0".
void append_float(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, end);  // [-]d[.ddd]e±XX
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const auto e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e + 1));
  if (negative) out += '-';
  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  } else if (exponent < 0) {
    out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
    out += digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(exponent) + 1) + "." + digits.substr(static_cast<size_t>(exponent) + 1);
  }
}

void append_json(std::string& out, const nlohmann::ordered_json& v) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.items()) {
        if (!first) out += ", ";
        first = false;
        append_string(out, key);
        out += ": ";
        append_json(out, value);
      }
      out += '}';
      break;
    }
    case nlohmann::ordered_json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        append_json(out, v[i]);
      }
      out += ']';
      break;
    }
    case nlohmann::ordered_json::value_t::string:
      append_string(out, v.get<std::string>());
      break;
    case nlohmann::ordered_json::value_t::number_float:
      append_float(out, v.get<double>());
      break;
    case nlohmann::ordered_json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      out += "null";
      break;
    default:
      out += v.dump();
      break;  // integers
  }
}

void check_roles(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      throw ValueError("apply_chatml: message " + std::to_string(i) + " has unknown role '" + role + "'");
    }
    if (!messages[i].tool_calls.empty() && role != "assistant") {
      throw ValueError("apply_chatml: message " + std::to_string(i) + " (" + role +
                       ") has tool calls; only assistant messages do");
    }
  }
}

std::string render_qwen2_5(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) {
  if (messages.empty()) throw ValueError("apply_chatml: the Qwen2.5 template needs at least one message");
  std::string out = "<|im_start|>system\n";
  const bool first_system = messages.front().role == "system";
  out += first_system ? messages.front().content : options.default_system.value_or(kQwenSystem);
  if (!options.tools.empty()) {
    out +=
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const auto& tool : options.tools) {
      out += '\n';
      append_json(out, tool);
    }
    out +=
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call>";
  }
  out += "<|im_end|>\n";
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0) || (m.role == "assistant" && m.tool_calls.empty())) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      out += "<|im_start|>assistant";
      if (!m.content.empty()) out += "\n" + m.content;
      for (const auto& call : m.tool_calls) {
        out += "\n<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " + python_json_dumps(call.arguments) +
               "}\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_chatml(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) {
  if (!options.tools.empty()) throw ValueError("apply_chatml: plain ChatML has no tools list (use kQwen2_5)");
  std::string out;
  auto turn = [&](const std::string& role, const std::string& content) {
    out += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
  };
  const bool has_system = !messages.empty() && messages.front().role == "system";
  if (!has_system && options.default_system) turn("system", *options.default_system);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].tool_calls.empty()) {
      throw ValueError("apply_chatml: message " + std::to_string(i) + ": plain ChatML has no tool calls");
    }
    turn(messages[i].role, messages[i].content);
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  append_json(out, value);
  return out;
}

std::string apply_chatml(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) {
  check_roles(messages);
  return options.chat_template == ChatTemplate::kQwen2_5 ? render_qwen2_5(messages, options)
                                                         : render_chatml(messages, options);
}

}  // namespace hyflow::models
