#include <hyflow/agents/agent_config.hpp>
#include <hyflow/agents/answer_check_interaction.hpp>
#include <hyflow/agents/calculator_tool.hpp>
#include <hyflow/agents/code_tool.hpp>
#include <hyflow/core/error.hpp>

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <set>

namespace hyflow::agents {
namespace {

using Json = nlohmann::json;

const char* kMultiTurn = "actor_rollout_ref.rollout.multi_turn";
const char* kAgent = "actor_rollout_ref.rollout.agent";
const std::set<std::string> kAgentKeys = {"num_workers",      "default_agent_loop", "external_command",
                                          "external_timeout", "external_reward",    "external_keep_files"};

void check_keys(const Json& section, const char* where, const std::set<std::string>& known) {
  if (!section.is_object()) throw ValueError(std::string(where) + ": expected a mapping, got " + section.dump());
  for (auto it = section.begin(); it != section.end(); ++it)
    if (!known.count(it.key())) throw ValueError(std::string(where) + "." + it.key() + ": unknown key");
}

int64_t int_key(const Json& s, const char* where, const char* key, int64_t fallback, int64_t min) {
  if (!s.contains(key)) return fallback;
  const Json& v = s.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < min)
    throw ValueError(std::string(where) + "." + key + ": expected an integer >= " + std::to_string(min) + ", got " +
                     v.dump());
  return v.get<int64_t>();
}

std::optional<int64_t> optional_int_key(const Json& s, const char* where, const char* key) {
  if (!s.contains(key) || s.at(key).is_null()) return std::nullopt;
  return int_key(s, where, key, 0, 0);
}

std::string string_key(const Json& s, const char* where, const char* key, std::string fallback) {
  if (!s.contains(key) || s.at(key).is_null()) return fallback;
  if (!s.at(key).is_string()) throw ValueError(std::string(where) + "." + key + ": expected a string");
  return s.at(key).get<std::string>();
}

bool bool_key(const Json& s, const char* where, const char* key, bool fallback) {
  if (!s.contains(key)) return fallback;
  if (!s.at(key).is_boolean()) throw ValueError(std::string(where) + "." + key + ": expected true or false");
  return s.at(key).get<bool>();
}

Json scalar(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;  // quoted: a string
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") return nullptr;
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  int64_t i = 0;
  if (YAML::convert<int64_t>::decode(node, i)) return i;
  double d = 0;
  if (YAML::convert<double>::decode(node, d)) return d;
  return text;
}

Json to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      return scalar(node);
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& item : node) out.push_back(to_json(item));
      return out;
    }
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& kv : node) out[kv.first.as<std::string>()] = to_json(kv.second);
      return out;
    }
  }
  return nullptr;
}

// The list under `key`, each entry an object; errors name path and entry.
const Json& entries(const Json& doc, const std::string& path, const char* key) {
  if (!doc.is_object() || !doc.contains(key) || !doc.at(key).is_array())
    throw ValueError(path + ": expected a top-level '" + key + "' list");
  for (size_t i = 0; i < doc.at(key).size(); ++i)
    if (!doc.at(key)[i].is_object())
      throw ValueError(path + ": " + key + "[" + std::to_string(i) + "] is not a mapping");
  return doc.at(key);
}

std::string entry_string(const Json& entry, const std::string& where, const char* key) {
  if (!entry.contains(key) || !entry.at(key).is_string() || entry.at(key).get<std::string>().empty())
    throw ValueError(where + "." + key + ": missing or not a non-empty string");
  return entry.at(key).get<std::string>();
}

Json entry_config(const Json& entry, const std::string& where) {
  if (!entry.contains("config") || entry.at("config").is_null()) return Json::object();
  if (!entry.at("config").is_object()) throw ValueError(where + ".config: expected a mapping");
  return entry.at("config");
}

}  // namespace

MultiTurnConfig parse_multi_turn_config(const Json& rollout) {
  MultiTurnConfig c;
  if (!rollout.is_object() || !rollout.contains("multi_turn") || rollout.at("multi_turn").is_null()) return c;
  const Json& s = rollout.at("multi_turn");
  check_keys(s, kMultiTurn,
             {"enable", "max_assistant_turns", "max_user_turns", "max_parallel_calls", "max_tool_response_length",
              "tool_response_truncate_side", "tool_plugins", "tool_config_path", "interaction_config_path", "format",
              "use_inference_chat_template", "tokenization_sanity_check_mode"});
  c.enable = bool_key(s, kMultiTurn, "enable", c.enable);
  c.max_assistant_turns = optional_int_key(s, kMultiTurn, "max_assistant_turns");
  c.max_user_turns = optional_int_key(s, kMultiTurn, "max_user_turns");
  c.max_parallel_calls = int_key(s, kMultiTurn, "max_parallel_calls", c.max_parallel_calls, 1);
  c.max_tool_response_length = int_key(s, kMultiTurn, "max_tool_response_length", c.max_tool_response_length, 1);
  const std::string side = string_key(s, kMultiTurn, "tool_response_truncate_side", "middle");
  if (side == "left") {
    c.tool_response_truncate_side = TruncateSide::left;
  } else if (side == "right") {
    c.tool_response_truncate_side = TruncateSide::right;
  } else if (side == "middle") {
    c.tool_response_truncate_side = TruncateSide::middle;
  } else {
    throw ValueError(std::string(kMultiTurn) + ".tool_response_truncate_side: expected left, right or middle, got '" +
                     side + "'");
  }
  if (s.contains("tool_plugins") && !s.at("tool_plugins").is_null()) {
    const Json& plugins = s.at("tool_plugins");
    if (!plugins.is_array())
      throw ValueError(std::string(kMultiTurn) + ".tool_plugins: expected a list of paths, got " + plugins.dump());
    for (const Json& path : plugins) {
      if (!path.is_string() || path.get<std::string>().empty())
        throw ValueError(std::string(kMultiTurn) + ".tool_plugins: expected non-empty path strings, got " +
                         path.dump());
      c.tool_plugins.push_back(path.get<std::string>());
    }
  }
  c.tool_config_path = string_key(s, kMultiTurn, "tool_config_path", "");
  c.interaction_config_path = string_key(s, kMultiTurn, "interaction_config_path", "");
  c.format = string_key(s, kMultiTurn, "format", c.format);
  if (c.format != "hermes")
    throw ValueError(std::string(kMultiTurn) + ".format: only 'hermes' (<tool_call> blocks) is supported, got '" +
                     c.format + "'");
  return c;
}

ChatTemplateKwargs parse_chat_template_kwargs(const Json& rollout) {
  ChatTemplateKwargs c;
  const char* where = "data.apply_chat_template_kwargs";
  if (!rollout.is_object() || !rollout.contains("apply_chat_template_kwargs") ||
      rollout.at("apply_chat_template_kwargs").is_null())
    return c;
  const Json& s = rollout.at("apply_chat_template_kwargs");
  check_keys(s, where, {"default_system", "list_tools"});
  if (s.contains("default_system") && !s.at("default_system").is_null())
    c.default_system = string_key(s, where, "default_system", "");
  c.list_tools = bool_key(s, where, "list_tools", c.list_tools);
  return c;
}

AgentConfig parse_agent_config(const Json& rollout) {
  AgentConfig c;
  if (parse_multi_turn_config(rollout).enable) c.default_agent_loop = "tool_agent";
  if (!rollout.is_object() || !rollout.contains("agent") || rollout.at("agent").is_null()) return c;
  const Json& s = rollout.at("agent");
  check_keys(s, kAgent, kAgentKeys);
  c.num_workers = int_key(s, kAgent, "num_workers", c.num_workers, 1);
  c.default_agent_loop = string_key(s, kAgent, "default_agent_loop", c.default_agent_loop);
  return c;
}

ExternalAgentConfig parse_external_agent_config(const Json& rollout) {
  ExternalAgentConfig c;
  if (!rollout.is_object() || !rollout.contains("agent") || rollout.at("agent").is_null()) return c;
  const Json& s = rollout.at("agent");
  check_keys(s, kAgent, kAgentKeys);
  if (s.contains("external_command") && !s.at("external_command").is_null()) {
    const Json& argv = s.at("external_command");
    if (!argv.is_array())
      throw ValueError(std::string(kAgent) + ".external_command: expected a list (the program's argv), got " +
                       argv.dump());
    for (const auto& arg : argv) {
      if (!arg.is_string())
        throw ValueError(std::string(kAgent) + ".external_command: " + arg.dump() + " is not a string");
      c.command.push_back(arg.get<std::string>());
    }
    if (!c.command.empty() && c.command.front().empty())
      throw ValueError(std::string(kAgent) + ".external_command: the program name is empty");
  }
  if (s.contains("external_timeout") && !s.at("external_timeout").is_null()) {
    const Json& t = s.at("external_timeout");
    if (!t.is_number() || !(t.get<double>() > 0))
      throw ValueError(std::string(kAgent) + ".external_timeout: expected seconds > 0, got " + t.dump());
    c.timeout = t.get<double>();
  }
  c.reward = string_key(s, kAgent, "external_reward", c.reward);
  if (c.reward != "agent" && c.reward != "reward_fn")
    throw ValueError(std::string(kAgent) + ".external_reward: expected agent or reward_fn, got '" + c.reward + "'");
  c.keep_files = bool_key(s, kAgent, "external_keep_files", c.keep_files);
  return c;
}

std::string truncate_tool_response(const std::string& text, int64_t limit, TruncateSide side) {
  const auto n = static_cast<size_t>(limit);
  if (text.size() <= n) return text;
  switch (side) {
    case TruncateSide::left:
      return text.substr(0, n) + "...(truncated)";
    case TruncateSide::right:
      return "(truncated)..." + text.substr(text.size() - n);
    case TruncateSide::middle:
      break;
  }
  const size_t head = n / 2;
  return text.substr(0, head) + "\n...(truncated)...\n" + text.substr(text.size() - (n - head));
}

Json read_yaml_file(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) throw ValueError(path + ": no such file");
  try {
    return to_json(YAML::LoadFile(path));
  } catch (const YAML::Exception& e) {
    throw ValueError(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

std::map<std::string, std::shared_ptr<Tool>> load_tool_config(const std::string& path) {
  register_calculator_tool();
  register_code_tool();
  const Json doc = read_yaml_file(path);
  std::map<std::string, std::shared_ptr<Tool>> out;
  const Json& tools = entries(doc, path, "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = path + ": tools[" + std::to_string(i) + "]";
    const Json& entry = tools[i];
    const std::string class_name = entry_string(entry, where, "class_name");
    if (!entry.contains("tool_schema")) throw ValueError(where + ".tool_schema: missing");
    ToolSchema schema;
    try {
      schema = ToolSchema::from_openai(entry.at("tool_schema"));
    } catch (const ValueError& e) {
      throw ValueError(where + "." + e.what());
    }
    std::unique_ptr<Tool> tool;
    try {
      tool = make_tool(class_name, entry_config(entry, where), schema);
    } catch (const KeyError& e) {
      throw KeyError(where + ".class_name: " + e.what());
    } catch (const ValueError& e) {
      throw ValueError(where + ".config: " + e.what());
    }
    if (out.count(schema.name)) throw ValueError(where + ": a second tool named '" + schema.name + "'");
    out.emplace(schema.name, std::move(tool));
  }
  return out;
}

std::map<std::string, std::shared_ptr<Interaction>> load_interaction_config(const std::string& path) {
  register_builtin_interactions();
  const Json doc = read_yaml_file(path);
  std::map<std::string, std::shared_ptr<Interaction>> out;
  const Json& list = entries(doc, path, "interaction");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = path + ": interaction[" + std::to_string(i) + "]";
    const Json& entry = list[i];
    const std::string class_name = entry_string(entry, where, "class_name");
    const std::string name = entry.contains("name") ? entry_string(entry, where, "name") : class_name;
    std::unique_ptr<Interaction> interaction;
    try {
      interaction = make_interaction(class_name, name, entry_config(entry, where));
    } catch (const KeyError& e) {
      throw KeyError(where + ".class_name: " + e.what());
    } catch (const ValueError& e) {
      throw ValueError(where + ".config: " + e.what());
    }
    if (out.count(name)) throw ValueError(where + ".name: a second interaction named '" + name + "'");
    out.emplace(name, std::move(interaction));
  }
  return out;
}

}  // namespace hyflow::agents
