#include <hyflow/agents/interaction.hpp>
#include <hyflow/agents/tool.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/core/named_registry.hpp>

namespace hyflow::agents {
namespace {

NamedRegistry<ToolFactory>& tools() {
  static NamedRegistry<ToolFactory> registry("tool class (tool_config_path: class_name)");
  return registry;
}

NamedRegistry<InteractionFactory>& interactions() {
  static NamedRegistry<InteractionFactory> registry("interaction class (interaction_config_path: class_name)");
  return registry;
}

std::string field_string(const nlohmann::json& object, const char* key, const char* where) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string())
    throw ValueError(std::string(where) + ": '" + key + "' is missing or not a string");
  return it->get<std::string>();
}

}  // namespace

nlohmann::json ToolSchema::to_openai() const {
  nlohmann::json function = {{"name", name}, {"description", description}, {"parameters", parameters}};
  return {{"type", "function"}, {"function", std::move(function)}};
}

ToolSchema ToolSchema::from_openai(const nlohmann::json& schema) {
  if (!schema.is_object()) throw ValueError("tool_schema: expected an object, got " + std::string(schema.type_name()));
  if (schema.contains("type") && schema["type"] != "function")
    throw ValueError("tool_schema.type: only \"function\" tools are supported, got " + schema["type"].dump());
  auto function = schema.find("function");
  if (function == schema.end() || !function->is_object())
    throw ValueError("tool_schema.function: missing or not an object");
  ToolSchema out;
  out.name = field_string(*function, "name", "tool_schema.function");
  if (out.name.empty()) throw ValueError("tool_schema.function.name: empty");
  if (function->contains("description"))
    out.description = field_string(*function, "description", "tool_schema.function");
  if (function->contains("parameters")) {
    out.parameters = (*function)["parameters"];
    if (!out.parameters.is_object()) throw ValueError("tool_schema.function.parameters: not an object");
  }
  return out;
}

void register_tool(const std::string& class_name, ToolFactory factory) {
  if (class_name.empty()) throw ValueError("register_tool: the class name is empty");
  tools().put(class_name, std::move(factory), /*overwrite=*/true);
}

bool has_tool(const std::string& class_name) {
  return tools().contains(class_name);
}

std::vector<std::string> tool_names() {
  return tools().names();
}

std::unique_ptr<Tool> make_tool(const std::string& class_name, const nlohmann::json& config, ToolSchema schema) {
  auto tool = tools().get(class_name)(config, std::move(schema));
  if (!tool) throw ValueError("tool class '" + class_name + "': its factory returned nothing");
  return tool;
}

void register_interaction(const std::string& class_name, InteractionFactory factory) {
  if (class_name.empty()) throw ValueError("register_interaction: the class name is empty");
  interactions().put(class_name, std::move(factory), /*overwrite=*/true);
}

bool has_interaction(const std::string& class_name) {
  return interactions().contains(class_name);
}

std::vector<std::string> interaction_names() {
  return interactions().names();
}

std::unique_ptr<Interaction> make_interaction(const std::string& class_name, const std::string& name,
                                              const nlohmann::json& config) {
  auto interaction = interactions().get(class_name)(name, config);
  if (!interaction) throw ValueError("interaction class '" + class_name + "': its factory returned nothing");
  return interaction;
}

}  // namespace hyflow::agents
