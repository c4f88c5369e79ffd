// The chat templates against the Jinja chat_template of Qwen2.5's tokenizer_config.json, rendered
// by Jinja2 (chat_template_reference.json, from make_chat_template_reference.py next to it).
#include <hyflow/core/error.hpp>
#include <hyflow/models/chat_template.hpp>

#include <catch2/catch.hpp>

#include <fstream>

using namespace hyflow;
using namespace hyflow::models;
using OJson = nlohmann::ordered_json;

namespace {

const std::filesystem::path kData = HYFLOW_MODELS_TEST_DATA;

std::vector<ChatMessage> messages_of(const OJson& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list) {
    ChatMessage message{m["role"].get<std::string>(), m["content"].is_null() ? "" : m["content"].get<std::string>()};
    if (m.contains("tool_calls")) {
      for (const auto& c : m["tool_calls"]) {
        const auto& f = c.contains("function") ? c["function"] : c;
        message.tool_calls.push_back({f["name"].get<std::string>(), f["arguments"]});
      }
    }
    out.push_back(std::move(message));
  }
  return out;
}

}  // namespace

TEST_CASE("Qwen2.5 conversations render exactly as the Jinja template renders them") {
  std::ifstream in(kData / "chat_template_reference.json");
  const auto cases = OJson::parse(in);
  REQUIRE(cases.size() >= 20);
  for (const auto& c : cases) {
    INFO("messages: " << c["messages"].dump() << " add_generation_prompt: " << c["add_generation_prompt"]);
    ChatTemplateOptions options{.add_generation_prompt = c["add_generation_prompt"].get<bool>()};
    if (c.contains("tools")) {
      for (const auto& t : c["tools"]) options.tools.push_back(t);
    }
    CHECK(apply_chatml(messages_of(c["messages"]), options) == c["text"].get<std::string>());
  }
}

TEST_CASE("plain ChatML renders each message as a turn and inserts a system turn only when asked") {
  const ChatTemplateOptions plain{.chat_template = ChatTemplate::kChatML};
  CHECK(apply_chatml({{"user", "hi"}, {"assistant", "hello"}},
                     {.add_generation_prompt = false, .chat_template = ChatTemplate::kChatML}) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n");
  CHECK(apply_chatml({{"user", "2+2?"}}, {.default_system = "Be brief.", .chat_template = ChatTemplate::kChatML}) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  CHECK(apply_chatml({{"user", "q"}, {"tool", "r"}}, plain) ==
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>tool\nr<|im_end|>\n<|im_start|>assistant\n");
  CHECK_THROWS_AS(apply_chatml({{"user", "x"}}, {.chat_template = ChatTemplate::kChatML, .tools = {OJson::object()}}),
                  ValueError);
}

TEST_CASE("Qwen2.5's default system turn can be replaced; bad conversations are rejected naming the message") {
  CHECK(apply_chatml({{"user", "2+2?"}}, {.default_system = "Be brief."}) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  CHECK_THROWS_WITH(apply_chatml({{"user", "x"}, {"robot", "x"}}),
                    Catch::Contains("message 1") && Catch::Contains("robot"));
  CHECK_THROWS_WITH(apply_chatml({{"user", "x", {{"f", OJson::object()}}}}), Catch::Contains("message 0"));
  CHECK_THROWS_AS(apply_chatml({}), ValueError);
}

TEST_CASE("tool arguments are written like Python's json.dumps") {
  const auto v = OJson::parse(R"({"b": 1, "a": [1.5, 100.0, 1e-7, 1e21, 0.0001, -0.0, 123456789012345678.0],)"
                              R"( "s": "q\"\\\n\t\u0001é", "n": null, "t": true})");
  CHECK(python_json_dumps(v) ==
        "{\"b\": 1, \"a\": [1.5, 100.0, 1e-07, 1e+21, 0.0001, -0.0, 1.2345678901234568e+17], "
        "\"s\": \"q\\\"\\\\\\n\\t\\u0001é\", \"n\": null, \"t\": true}");
}
