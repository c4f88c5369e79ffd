#pragma once
// The ChatML chat template (Qwen2/Qwen2.5 style):
//   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]

#include <optional>
#include <string>
#include <vector>

namespace hyflow::models {

struct ChatMessage {
  std::string role;  ///< "system", "user", "assistant" or "tool"
  std::string content;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;  ///< end with the assistant header
  /// Inserted as the system message when the conversation has none (Qwen2.5 inserts
  /// "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.").
  std::optional<std::string> default_system;
};

/// Renders messages; unknown roles raise hyflow::ValueError naming the role and index.
std::string apply_chatml(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options = {});

}  // namespace hyflow::models
