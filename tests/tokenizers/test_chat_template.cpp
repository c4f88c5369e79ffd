// The chat templates against the Jinja chat_templates of Qwen2.5's, Llama 3.1 Instruct's and Llama 3
// Instruct's tokenizer_config.json, rendered by Jinja2 (chat_template_reference.json,
// chat_template_llama3_1_reference.json and chat_template_llama3_reference.json, from
// make_chat_template_reference.py next to them).
#include <hyflow/core/error.hpp>
#include <hyflow/tokenizers/chat_template.hpp>

#include <catch2/catch.hpp>

#include <fstream>

using namespace hyflow;
using namespace hyflow::tokenizers;
using OJson = nlohmann::ordered_json;

namespace {

const std::filesystem::path kData = HYFLOW_TOKENIZERS_TEST_DATA;

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

OJson load(const std::string& name) {
  std::ifstream in(kData / name);
  REQUIRE(in.good());
  return OJson::parse(in);
}

}  // namespace

TEST_CASE("Qwen2.5 conversations render exactly as the Jinja template renders them") {
  const auto cases = load("chat_template_reference.json");
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

TEST_CASE("Llama 3.1 conversations render exactly as the Jinja template renders them, tools and dates included") {
  const auto cases = load("chat_template_llama3_1_reference.json");
  REQUIRE(cases.size() >= 20);
  for (const auto& c : cases) {
    INFO("case: " << c.dump());
    ChatTemplateOptions options{.add_generation_prompt = c["add_generation_prompt"].get<bool>(),
                                .chat_template = ChatTemplate::kLlama3_1};
    if (c.contains("tools")) {
      for (const auto& t : c["tools"]) options.tools.push_back(t);
    }
    if (c.contains("date_string")) options.date_string = c["date_string"].get<std::string>();
    if (c.contains("tools_in_user_message")) options.tools_in_user_message = c["tools_in_user_message"].get<bool>();
    if (c.contains("builtin_tools")) options.builtin_tools = c["builtin_tools"].get<std::vector<std::string>>();
    CHECK(apply_chatml(messages_of(c["messages"]), options) == c["text"].get<std::string>());
  }
}

TEST_CASE("Llama 3.1's system turn takes a replacement default and its date; bad conversations name the problem") {
  const ChatTemplateOptions llama{.chat_template = ChatTemplate::kLlama3_1};
  CHECK(apply_chatml({{"user", " 2+2? "}}, {.add_generation_prompt = false,
                                            .default_system = " Be brief.\n",
                                            .chat_template = ChatTemplate::kLlama3_1,
                                            .date_string = "05 Mar 2025"}) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 05 Mar 2025\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>");
  CHECK(apply_chatml({{"ipython", "r"}}, llama).find("<|start_header_id|>ipython<|end_header_id|>\n\n\"r\"") !=
        std::string::npos);
  CHECK_THROWS_AS(apply_chatml({}, llama), ValueError);
  CHECK_THROWS_WITH(apply_chatml({{"user", "x"}, {"ipython", "r"}}), Catch::Contains("message 1"));  // Qwen2.5
  CHECK_THROWS_WITH(
      apply_chatml({{"user", "x"}, {"assistant", "", {{"f", OJson::object()}, {"g", OJson::object()}}}}, llama),
      Catch::Contains("message 1") && Catch::Contains("exactly one tool call"));
  auto builtin = llama;
  builtin.builtin_tools = std::vector<std::string>{"brave_search"};
  CHECK_THROWS_WITH(apply_chatml({{"user", "x"}, {"assistant", "", {{"brave_search", OJson{{"query", 3}}}}}}, builtin),
                    Catch::Contains("message 1") && Catch::Contains("'query'"));
  auto tools = llama;
  tools.tools = {OJson{{"name", "f"}}};
  CHECK_THROWS_WITH(apply_chatml({{"system", "s"}}, tools), Catch::Contains("first user message"));
}

TEST_CASE("Llama 3 conversations render exactly as the Jinja template renders them") {
  const auto cases = load("chat_template_llama3_reference.json");
  REQUIRE(cases.size() >= 12);
  for (const auto& c : cases) {
    INFO("case: " << c.dump());
    const ChatTemplateOptions options{.add_generation_prompt = c["add_generation_prompt"].get<bool>(),
                                      .chat_template = ChatTemplate::kLlama3};
    CHECK(apply_chatml(messages_of(c["messages"]), options) == c["text"].get<std::string>());
  }
}

TEST_CASE("Llama 3 inserts a system turn only when asked and refuses tools and tool calls") {
  CHECK(apply_chatml({{"user", "2+2?"}}, {.default_system = " Be brief. ", .chat_template = ChatTemplate::kLlama3}) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK_THROWS_WITH(apply_chatml({{"user", "x"}, {"assistant", "", {{"f", OJson::object()}}}},
                                 {.chat_template = ChatTemplate::kLlama3}),
                    Catch::Contains("message 1") && Catch::Contains("no tool calls"));
  CHECK_THROWS_AS(apply_chatml({{"user", "x"}}, {.chat_template = ChatTemplate::kLlama3, .tools = {OJson::object()}}),
                  ValueError);
  CHECK_THROWS_AS(apply_chatml({{"ipython", "x"}}, {.chat_template = ChatTemplate::kLlama3}), ValueError);
}

TEST_CASE("trimming follows Python's str.strip over UTF-8 and JSON can be indented like json.dumps(indent=4)") {
  CHECK(python_strip("\t\n\x0b\x0c\r\x1c\x1f x y \u0085\u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000") ==
        "x y");
  CHECK(python_strip("\u200bx\u200b") == "\u200bx\u200b");  // zero width space is not whitespace to Python
  CHECK(python_strip("\xf0\x9f\x8e\x89 ") == "\xf0\x9f\x8e\x89");
  CHECK(python_strip("\xa0 x") == "\xa0 x");  // a stray continuation byte is not a space
  CHECK(python_strip(" \u3000 ") == "");
  CHECK(python_json_dumps(OJson::parse(R"({"a": [], "b": {}, "c": [1, {"d": null}]})"), 4) ==
        "{\n    \"a\": [],\n    \"b\": {},\n    \"c\": [\n        1,\n        {\n            \"d\": null\n        }\n  "
        "  ]\n}");
  CHECK(python_json_dumps(OJson::array({1, 2}), 0) == "[\n1,\n2\n]");
  CHECK_THROWS_AS(python_json_dumps(OJson::array(), -1), ValueError);
}
