#include <hyflow/serve/openai_request.hpp>

#include <hyflow/serve/api_error.hpp>

#include <limits>

namespace hyflow::serve {
namespace {

using ojson = nlohmann::ordered_json;

bool present(const ojson& body, const char* key) {
  return body.contains(key) && !body.at(key).is_null();
}

double number(const ojson& body, const char* key, double lo, double hi) {
  const auto& v = body.at(key);
  if (!v.is_number()) throw bad_request(key, std::string(key) + " must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    throw bad_request(key, std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                               "], got " + std::to_string(x));
  }
  return x;
}

int64_t integer(const ojson& body, const char* key, int64_t lo, int64_t hi) {
  const auto& v = body.at(key);
  if (!v.is_number_integer()) throw bad_request(key, std::string(key) + " must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    throw bad_request(key, std::string(key) + " must be at most " + std::to_string(hi));
  }
  const auto x = v.get<int64_t>();
  if (x < lo || x > hi) {
    throw bad_request(key, std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                               "], got " + std::to_string(x));
  }
  return x;
}

bool boolean(const ojson& body, const char* key) {
  if (!present(body, key)) return false;
  if (!body.at(key).is_boolean()) throw bad_request(key, std::string(key) + " must be a boolean");
  return body.at(key).get<bool>();
}

std::string string_field(const ojson& body, const char* key) {
  if (!present(body, key)) return {};
  if (!body.at(key).is_string()) throw bad_request(key, std::string(key) + " must be a string");
  return body.at(key).get<std::string>();
}

// A field hyflow cannot honour: refused unless absent or at its neutral value.
void refuse_unless_neutral(const ojson& body, const char* key, const std::string& why) {
  if (!present(body, key)) return;
  const auto& v = body.at(key);
  const bool neutral = (v.is_number() && v.get<double>() == 0.0) || (v.is_object() && v.empty()) ||
                       (v.is_string() && v.get<std::string>() == "text") ||
                       (v.is_object() && v.value("type", "") == "text");
  if (!neutral) throw bad_request(key, std::string(key) + " is not supported: " + why);
}

void parse_sampling(const ojson& body, const RequestLimits& limits, SamplingRequest& r) {
  if (!body.is_object()) throw bad_request("", "the request body must be a JSON object");
  r.model = string_field(body, "model");
  if (present(body, "n")) r.n = integer(body, "n", 1, limits.max_n);
  if (present(body, "max_completion_tokens")) {
    r.max_tokens = integer(body, "max_completion_tokens", 1, limits.max_tokens);
  }
  if (present(body, "max_tokens")) r.max_tokens = integer(body, "max_tokens", 1, limits.max_tokens);
  if (present(body, "temperature")) r.sampling.temperature = number(body, "temperature", 0.0, 2.0);
  if (present(body, "top_p")) {
    r.sampling.top_p = number(body, "top_p", 0.0, 1.0);
    if (r.sampling.top_p == 0.0) throw bad_request("top_p", "top_p must be > 0");
  }
  if (present(body, "top_k")) r.sampling.top_k = integer(body, "top_k", -1, std::numeric_limits<int32_t>::max());
  if (present(body, "min_p")) r.sampling.min_p = number(body, "min_p", 0.0, 1.0);
  if (present(body, "seed")) {
    r.seed = static_cast<uint64_t>(
        integer(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  }
  if (present(body, "stop")) {
    const auto& stop = body.at("stop");
    if (stop.is_string()) {
      r.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      if (stop.size() > limits.max_stop) {
        throw bad_request("stop", "stop holds " + std::to_string(stop.size()) + " strings, at most " +
                                      std::to_string(limits.max_stop) + " are allowed");
      }
      for (const auto& s : stop) {
        if (!s.is_string()) throw bad_request("stop", "stop must be a string or an array of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      throw bad_request("stop", "stop must be a string or an array of strings");
    }
    for (const auto& s : r.stop) {
      if (s.empty() || s.size() > limits.max_stop_chars) {
        throw bad_request("stop", "each stop string must have 1 to " + std::to_string(limits.max_stop_chars) +
                                      " bytes, got " + std::to_string(s.size()));
      }
    }
  }
  r.stream = boolean(body, "stream");
  if (present(body, "stream_options")) {
    const auto& so = body.at("stream_options");
    if (!so.is_object()) throw bad_request("stream_options", "stream_options must be an object");
    r.include_usage = boolean(so, "include_usage");
  }
  r.return_token_ids = boolean(body, "return_token_ids");
  r.ignore_eos = boolean(body, "ignore_eos");
  r.user = string_field(body, "user");
  refuse_unless_neutral(body, "frequency_penalty", "the engine applies no penalties");
  refuse_unless_neutral(body, "presence_penalty", "the engine applies no penalties");
  refuse_unless_neutral(body, "logit_bias", "the engine applies no logit bias");
  refuse_unless_neutral(body, "response_format", "only text responses are produced");
}

// A message's content: a string, null, or an array of {"type": "text", "text": ...} parts.
std::string content_of(const ojson& message, const std::string& where) {
  if (!message.contains("content") || message.at("content").is_null()) return {};
  const auto& c = message.at("content");
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request(where + ".content", where + ".content must be a string or an array of parts");
  std::string text;
  for (const auto& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part.at("text").is_string()) {
      throw bad_request(where + ".content",
                        where + ".content: only {\"type\": \"text\", \"text\": ...} parts are supported");
    }
    text += part.at("text").get<std::string>();
  }
  return text;
}

std::vector<tokenizers::ToolCall> tool_calls_of(const ojson& message, const std::string& where) {
  std::vector<tokenizers::ToolCall> calls;
  if (!present(message, "tool_calls")) return calls;
  const auto& list = message.at("tool_calls");
  const auto field = where + ".tool_calls";
  if (!list.is_array()) throw bad_request(field, field + " must be an array");
  for (const auto& call : list) {
    if (!call.is_object() || !call.contains("function") || !call.at("function").is_object()) {
      throw bad_request(field, field + ": each call needs a \"function\" object");
    }
    const auto& f = call.at("function");
    if (!f.contains("name") || !f.at("name").is_string()) {
      throw bad_request(field, field + ": function.name must be a string");
    }
    tokenizers::ToolCall out{.name = f.at("name").get<std::string>()};
    if (f.contains("arguments") && !f.at("arguments").is_null()) {
      const auto& a = f.at("arguments");
      if (a.is_string()) {
        auto parsed = ojson::parse(a.get<std::string>(), nullptr, false);
        if (parsed.is_discarded() || !parsed.is_object()) {
          throw bad_request(field, field + ": function.arguments must be a JSON object encoded as a string");
        }
        out.arguments = std::move(parsed);
      } else if (a.is_object()) {
        out.arguments = a;
      } else {
        throw bad_request(field, field + ": function.arguments must be a JSON string");
      }
    }
    calls.push_back(std::move(out));
  }
  return calls;
}

}  // namespace

ChatRequest parse_chat_request(const nlohmann::ordered_json& body, const RequestLimits& limits) {
  ChatRequest r;
  parse_sampling(body, limits, r);
  if (body.contains("logprobs") && !body.at("logprobs").is_null()) r.logprobs = boolean(body, "logprobs");
  if (present(body, "top_logprobs")) {
    r.top_logprobs = integer(body, "top_logprobs", 0, 20);
    if (r.top_logprobs > 0 && !r.logprobs) {
      throw bad_request("top_logprobs", "top_logprobs needs logprobs: true");
    }
  }
  if (!body.contains("messages")) throw bad_request("messages", "messages is required");
  const auto& messages = body.at("messages");
  if (!messages.is_array() || messages.empty()) throw bad_request("messages", "messages must be a non-empty array");
  if (messages.size() > limits.max_messages) {
    throw bad_request("messages", "messages holds " + std::to_string(messages.size()) + " messages, at most " +
                                      std::to_string(limits.max_messages) + " are allowed");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const auto where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_request(where, where + " must be an object");
    if (!m.contains("role") || !m.at("role").is_string()) {
      throw bad_request(where + ".role", where + ".role must be a string");
    }
    auto role = m.at("role").get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      throw bad_request(where + ".role",
                        where + ".role must be system, developer, user, assistant or tool, got \"" + role + "\"");
    }
    r.messages.push_back({.role = role, .content = content_of(m, where), .tool_calls = tool_calls_of(m, where)});
    if (!r.messages.back().tool_calls.empty() && role != "assistant") {
      throw bad_request(where + ".tool_calls", where + ": only assistant messages carry tool_calls");
    }
  }
  if (present(body, "tools")) {
    const auto& tools = body.at("tools");
    if (!tools.is_array()) throw bad_request("tools", "tools must be an array");
    if (tools.size() > limits.max_tools) {
      throw bad_request("tools", "tools holds " + std::to_string(tools.size()) + " tools, at most " +
                                     std::to_string(limits.max_tools) + " are allowed");
    }
    for (size_t i = 0; i < tools.size(); ++i) {
      const auto& t = tools[i];
      const auto where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
          !t.at("function").is_object() || !t.at("function").contains("name") ||
          !t.at("function").at("name").is_string()) {
        throw bad_request(where, where + " must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      r.tools.push_back(t);
    }
  }
  if (present(body, "tool_choice")) {
    const auto& c = body.at("tool_choice");
    if (c == "none") {
      r.tool_choice_none = true;
    } else if (c != "auto") {
      throw bad_request("tool_choice",
                        "tool_choice must be \"auto\" or \"none\": the server does not constrain "
                        "decoding to force a call");
    }
  }
  return r;
}

CompletionRequest parse_completion_request(const nlohmann::ordered_json& body, const RequestLimits& limits) {
  CompletionRequest r;
  parse_sampling(body, limits, r);
  if (present(body, "logprobs")) {
    const auto& lp = body.at("logprobs");
    if (lp.is_boolean()) {
      r.logprobs = lp.get<bool>();
    } else {
      r.top_logprobs = integer(body, "logprobs", 0, 20);  // the k most likely tokens at each position
      r.logprobs = true;
    }
  }
  if (boolean(body, "echo")) throw bad_request("echo", "echo is not supported");
  if (present(body, "suffix")) throw bad_request("suffix", "suffix is not supported");
  if (!present(body, "prompt")) throw bad_request("prompt", "prompt is required");
  const auto& p = body.at("prompt");
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && p.front().is_number_integer()) {
    if (p.size() > limits.max_prompt_tokens) {
      throw bad_request("prompt", "prompt holds " + std::to_string(p.size()) + " token ids, at most " +
                                      std::to_string(limits.max_prompt_tokens) + " are allowed");
    }
    for (const auto& id : p) {
      if (!id.is_number_integer()) throw bad_request("prompt", "prompt: token ids must be integers");
      r.prompt_ids.push_back(id.get<int64_t>());
    }
  } else if (p.is_array() && p.size() == 1 && (p.front().is_string() || p.front().is_array())) {
    ojson single = body;
    single["prompt"] = p.front();
    return parse_completion_request(single, limits);
  } else {
    throw bad_request("prompt", "prompt must be a string or an array of token ids (one prompt per request)");
  }
  return r;
}

}  // namespace hyflow::serve
