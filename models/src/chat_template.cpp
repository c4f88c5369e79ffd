#include <hyflow/models/chat_template.hpp>

#include <hyflow/core/error.hpp>

namespace hyflow::models {

std::string apply_chatml(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) {
  std::string out;
  auto turn = [&](const std::string& role, const std::string& content) {
    out += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
  };
  const bool has_system = !messages.empty() && messages.front().role == "system";
  if (!has_system && options.default_system) turn("system", *options.default_system);
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      throw ValueError("apply_chatml: message " + std::to_string(i) + " has unknown role '" + role + "'");
    }
    if (role == "system" && i != 0) {
      throw ValueError("apply_chatml: message " + std::to_string(i) + ": a system message must come first");
    }
    turn(role, messages[i].content);
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace hyflow::models
