#include <hyflow/tokenizers/chat_template.hpp>

#include <hyflow/core/error.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace hyflow::tokenizers {
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

// Python's str.isspace for one code point.
bool python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// The code point of the well-formed UTF-8 sequence of n bytes at s[i], or UINT32_MAX.
uint32_t code_point(const std::string& s, size_t i, size_t n) {
  if (i + n > s.size()) return UINT32_MAX;
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  if (n == 1) return b(0) < 0x80 ? b(0) : UINT32_MAX;
  const unsigned char lead_mask = n == 2 ? 0xe0 : n == 3 ? 0xf0 : 0xf8;
  const unsigned char lead_bits = n == 2 ? 0xc0 : n == 3 ? 0xe0 : 0xf0;
  if ((b(0) & lead_mask) != lead_bits) return UINT32_MAX;
  uint32_t cp = b(0) & static_cast<unsigned char>(~lead_mask);
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return UINT32_MAX;
    cp = (cp << 6) | (b(k) & 0x3f);
  }
  return (n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) ? UINT32_MAX : cp;  // overlong forms are not UTF-8
}

// Length of the whitespace code point starting at s[i], 0 when there is none.
size_t space_at(const std::string& s, size_t i) {
  for (size_t n = 1; n <= 3; ++n) {  // every Python space is at most 3 UTF-8 bytes
    const uint32_t cp = code_point(s, i, n);
    if (cp != UINT32_MAX) return python_space(cp) ? n : 0;
  }
  return 0;
}

// Length of the whitespace code point ending at s[end - 1] (not before begin), 0 when there is none.
size_t space_before(const std::string& s, size_t begin, size_t end) {
  for (size_t n = 1; n <= 3 && n <= end - begin; ++n) {
    const uint32_t cp = code_point(s, end - n, n);
    if (cp != UINT32_MAX) return python_space(cp) ? n : 0;
  }
  return 0;
}

// indent < 0: one line with ", " between items; else Python's indent: each item on its own line,
// "," between items, empty containers as "{}" / "[]".
void append_json(std::string& out, const nlohmann::ordered_json& v, int indent = -1, int depth = 0) {
  const auto separate = [&](bool first, int level) {
    if (indent < 0) {
      if (!first) out += ", ";
      return;
    }
    if (!first) out += ',';
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.items()) {
        separate(first, depth + 1);
        first = false;
        append_string(out, key);
        out += ": ";
        append_json(out, value, indent, depth + 1);
      }
      if (!v.empty() && indent >= 0) separate(true, depth);
      out += '}';
      break;
    }
    case nlohmann::ordered_json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        separate(i == 0, depth + 1);
        append_json(out, v[i], indent, depth + 1);
      }
      if (!v.empty() && indent >= 0) separate(true, depth);
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

void check_roles(const std::vector<ChatMessage>& messages, bool ipython) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        !(ipython && role == "ipython")) {
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

constexpr const char* kLlamaFunctionFormat =
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}."
    "Do not use variables.\n\n";

std::string llama_header(const std::string& role) {
  return "<|start_header_id|>" + role + "<|end_header_id|>\n\n";
}

void append_llama_tools(std::string& out, const std::vector<nlohmann::ordered_json>& tools) {
  for (const auto& tool : tools) {
    append_json(out, tool, 4);
    out += "\n\n";
  }
}

// The one tool call of an assistant message: JSON, or for a built-in tool its python_tag call.
void append_llama_tool_call(std::string& out, const ChatMessage& m, size_t index, const ChatTemplateOptions& options) {
  const auto where = "apply_chatml: message " + std::to_string(index) + ": ";
  if (m.tool_calls.size() != 1) {
    throw ValueError(where + "Llama 3.1's template takes exactly one tool call per message, not " +
                     std::to_string(m.tool_calls.size()));
  }
  const auto& call = m.tool_calls.front();
  out += llama_header("assistant");
  const auto& builtin = options.builtin_tools;
  if (builtin && std::find(builtin->begin(), builtin->end(), call.name) != builtin->end()) {
    if (!call.arguments.is_object()) {
      throw ValueError(where + "the arguments of built-in tool '" + call.name + "' are not an object");
    }
    out += "<|python_tag|>" + call.name + ".call(";
    bool first = true;
    for (const auto& [name, value] : call.arguments.items()) {
      if (!value.is_string()) {
        throw ValueError(where + "argument '" + name + "' of built-in tool '" + call.name + "' is not a string");
      }
      if (!first) out += ", ";
      first = false;
      out += name + "=\"" + value.get<std::string>() + "\"";
    }
    out += ")";
  } else {
    out += "{\"name\": \"" + call.name + "\", \"parameters\": " + python_json_dumps(call.arguments) + "}";
  }
  out += builtin ? "<|eom_id|>" : "<|eot_id|>";
}

std::string render_llama3_1(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) {
  if (messages.empty()) throw ValueError("apply_chatml: the Llama 3.1 template needs at least one message");
  const bool has_tools = !options.tools.empty();
  size_t next = 0;
  std::string system;
  if (messages.front().role == "system") {
    system = python_strip(messages.front().content);
    next = 1;
  } else if (options.default_system) {
    system = python_strip(*options.default_system);
  }
  std::string out = "<|begin_of_text|>" + llama_header("system");
  if (options.builtin_tools || has_tools) out += "Environment: ipython\n";
  if (options.builtin_tools) {
    out += "Tools: ";
    bool first = true;
    for (const auto& tool : *options.builtin_tools) {
      if (tool == "code_interpreter") continue;
      if (!first) out += ", ";
      first = false;
      out += tool;
    }
    out += "\n\n";
  }
  out += "Cutting Knowledge Date: December 2023\nToday Date: " + options.date_string + "\n\n";
  if (has_tools && !options.tools_in_user_message) {
    out +=
        "You have access to the following functions. To call a function, please respond with JSON for a function "
        "call.";
    out += kLlamaFunctionFormat;
    append_llama_tools(out, options.tools);
  }
  out += system + "<|eot_id|>";
  if (has_tools && options.tools_in_user_message) {
    if (next == messages.size()) {
      throw ValueError(
          "apply_chatml: Llama 3.1's template puts the tools in the first user message, and there is none");
    }
    out += llama_header("user") +
           "Given the following functions, please respond with a JSON for a function call with its proper arguments "
           "that best answers the given prompt.\n\n";
    out += kLlamaFunctionFormat;
    append_llama_tools(out, options.tools);
    out += python_strip(messages[next].content) + "<|eot_id|>";
    ++next;
  }
  for (size_t i = next; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.tool_calls.empty()) {
      append_llama_tool_call(out, m, i, options);
    } else if (m.role == "tool" || m.role == "ipython") {
      out += llama_header("ipython") + python_json_dumps(m.content) + "<|eot_id|>";  // a string is iterable: tojson
    } else {
      out += llama_header(m.role) + python_strip(m.content) + "<|eot_id|>";
    }
  }
  if (options.add_generation_prompt) out += llama_header("assistant");
  return out;
}

// Llama 3 Instruct: each message one trimmed turn, <|begin_of_text|> before the first; no tools.
std::string render_llama3(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) {
  if (!options.tools.empty() || options.builtin_tools) {
    throw ValueError("apply_chatml: Llama 3's template has no tools (use kLlama3_1)");
  }
  std::string out;
  auto turn = [&](const std::string& role, const std::string& content) {
    if (out.empty()) out += "<|begin_of_text|>";
    out += llama_header(role) + python_strip(content) + "<|eot_id|>";
  };
  const bool has_system = !messages.empty() && messages.front().role == "system";
  if (!has_system && options.default_system) turn("system", *options.default_system);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].tool_calls.empty()) {
      throw ValueError("apply_chatml: message " + std::to_string(i) + ": Llama 3's template has no tool calls");
    }
    turn(messages[i].role, messages[i].content);
  }
  if (options.add_generation_prompt) out += llama_header("assistant");
  return out;
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value, std::optional<int> indent) {
  if (indent && *indent < 0) throw ValueError("python_json_dumps: negative indent " + std::to_string(*indent));
  std::string out;
  append_json(out, value, indent.value_or(-1));
  return out;
}

std::string python_strip(const std::string& s) {
  size_t begin = 0;
  size_t end = s.size();
  while (begin < end) {
    const size_t n = space_at(s, begin);
    if (n == 0) break;
    begin += n;
  }
  while (end > begin) {
    const size_t n = space_before(s, begin, end);
    if (n == 0) break;
    end -= n;
  }
  return s.substr(begin, end - begin);
}

std::string apply_chatml(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) {
  check_roles(messages, options.chat_template == ChatTemplate::kLlama3_1);
  switch (options.chat_template) {
    case ChatTemplate::kQwen2_5:
      return render_qwen2_5(messages, options);
    case ChatTemplate::kLlama3_1:
      return render_llama3_1(messages, options);
    case ChatTemplate::kLlama3:
      return render_llama3(messages, options);
    case ChatTemplate::kChatML:
      break;
  }
  return render_chatml(messages, options);
}

}  // namespace hyflow::tokenizers
