// The pieces of hyflow::serve that need no engine: request checks that name the field, the
// tool-call parser (malformed calls stay text), streaming holdback of ChoiceState, and sessions
// as DataProto rows.
#include "../../serve/src/choice_state.hpp"

#include <hyflow/serve/api_error.hpp>
#include <hyflow/serve/openai_request.hpp>
#include <hyflow/serve/session_store.hpp>
#include <hyflow/serve/tool_call_parser.hpp>
#include <hyflow/tokenizers/bpe_tokenizer.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using namespace hyflow::serve;
using ojson = nlohmann::ordered_json;

namespace {

// The param and status of the ApiError `f` throws.
template <class F>
std::pair<int, std::string> api_error_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return {e.status(), e.param()};
  }
  return {0, "nothing thrown"};
}

ojson chat(ojson extra) {
  ojson body{{"model", "m"}, {"messages", ojson::array({{{"role", "user"}, {"content", "hi"}}})}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// UTF-8 of a code point below U+0800.
std::string utf8_2(int cp) {
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
}

// A byte-level BPE without merges (Qwen2's split pattern): ids 0-255 are the bytes, plus
// multi-byte tokens given as byte strings (ids 256, 257, ...).
tokenizers::BpeTokenizer byte_bpe(const std::vector<std::string>& extra) {
  std::vector<int> cp(256, -1);  // GPT-2's bytes_to_unicode
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    cp[static_cast<size_t>(b)] = printable ? b : next++;
  }
  auto token = [&](const std::string& bytes) {
    std::string t;
    for (unsigned char b : bytes) t += utf8_2(cp[b]);
    return t;
  };
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[token(std::string(1, static_cast<char>(b)))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[token(extra[i])] = 256 + static_cast<int64_t>(i);
  const char* pattern = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
                        R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
  nlohmann::json j{
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  return tokenizers::BpeTokenizer(j, "byte-level test tokenizer");
}

// Forwards to a tokenizer and counts the ids it was asked to decode.
class CountingTokenizer final : public tokenizers::Tokenizer {
 public:
  explicit CountingTokenizer(const tokenizers::Tokenizer& inner) : inner_(inner) {}
  std::vector<int64_t> encode(std::string_view text) const override { return inner_.encode(text); }
  std::string decode(const std::vector<int64_t>& ids, bool skip) const override {
    decoded += static_cast<int64_t>(ids.size());
    return inner_.decode(ids, skip);
  }
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  std::optional<int64_t> token_to_id(std::string_view t) const override { return inner_.token_to_id(t); }
  int64_t eos_token_id() const override { return inner_.eos_token_id(); }
  int64_t pad_token_id() const override { return inner_.pad_token_id(); }
  mutable int64_t decoded = 0;

 private:
  const tokenizers::Tokenizer& inner_;
};

}  // namespace

TEST_CASE("chat requests: fields are read, bad ones are 400 naming the field") {
  RequestLimits limits;
  auto r = parse_chat_request(chat({{"temperature", 0.5},
                                    {"top_p", 0.9},
                                    {"top_k", 5},
                                    {"min_p", 0.1},
                                    {"max_tokens", 7},
                                    {"n", 3},
                                    {"stop", "x"},
                                    {"seed", 4},
                                    {"logprobs", true},
                                    {"stream", true},
                                    {"return_token_ids", true},
                                    {"user", "s1"}}),
                              limits);
  CHECK(r.sampling.temperature == 0.5);
  CHECK(r.sampling.top_k == 5);
  CHECK(r.n == 3);
  CHECK(r.max_tokens == 7);
  CHECK(r.stop == std::vector<std::string>{"x"});
  CHECK(r.seed == 4u);
  CHECK(r.logprobs);
  CHECK(r.return_token_ids);
  CHECK(r.user == "s1");
  REQUIRE(r.messages.size() == 1);
  CHECK(r.messages[0].content == "hi");

  CHECK(api_error_of([&] {
          parse_chat_request(chat({{"temperature", "hot"}}), limits);
        }) == std::pair<int, std::string>{400, "temperature"});
  CHECK(api_error_of([&] { parse_chat_request(chat({{"n", 99}}), limits); }).second == "n");
  CHECK(api_error_of([&] { parse_chat_request(chat({{"max_tokens", 0}}), limits); }).second == "max_tokens");
  CHECK(api_error_of([&] { parse_chat_request(chat({{"messages", ojson::array()}}), limits); }).second == "messages");
  CHECK(api_error_of([&] {
          parse_chat_request(chat({{"messages", ojson::array({{{"role", "wizard"}, {"content", "x"}}})}}), limits);
        }).second == "messages[0].role");
  CHECK(api_error_of([&] { parse_chat_request(chat({{"tools", ojson::array({1})}}), limits); }).second == "tools[0]");
  CHECK(api_error_of([&] { parse_chat_request(chat({{"tool_choice", "required"}}), limits); }).second == "tool_choice");
  CHECK(api_error_of([&] {
          parse_chat_request(chat({{"frequency_penalty", 0.5}}), limits);
        }).second == "frequency_penalty");
  CHECK(api_error_of([&] { parse_chat_request(chat({{"top_logprobs", 3}}), limits); }).second == "top_logprobs");
  CHECK(api_error_of([&] {
          parse_chat_request(chat({{"logprobs", true}, {"top_logprobs", 21}}), limits);
        }).second == "top_logprobs");
  CHECK(parse_chat_request(chat({{"logprobs", true}, {"top_logprobs", 20}}), limits).top_logprobs == 20);
  CHECK(api_error_of([&] {
          parse_chat_request(chat({{"stop", ojson::array({"a", "b", "c", "d", "e"})}}), limits);
        }).second == "stop");
  limits.max_messages = 1;
  auto two = chat({});
  two["messages"].push_back({{"role", "assistant"}, {"content", "x"}});
  CHECK(api_error_of([&] { parse_chat_request(two, limits); }).second == "messages");
}

TEST_CASE("chat messages: content parts, developer role, assistant tool calls") {
  ojson messages = ojson::array(
      {{{"role", "developer"},
        {"content", ojson::array({{{"type", "text"}, {"text", "be "}}, {{"type", "text"}, {"text", "brief"}}})}},
       {{"role", "user"}, {"content", "weather?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", ojson::array({{{"id", "c1"},
                                      {"type", "function"},
                                      {"function", {{"name", "get"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny"}}});
  auto r = parse_chat_request(chat({{"messages", messages}}), {});
  REQUIRE(r.messages.size() == 4);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[0].content == "be brief");
  REQUIRE(r.messages[2].tool_calls.size() == 1);
  CHECK(r.messages[2].tool_calls[0].arguments.at("city") == "Oslo");
  messages[2]["tool_calls"][0]["function"]["arguments"] = "{not json";
  CHECK(api_error_of([&] {
          parse_chat_request(chat({{"messages", messages}}), {});
        }).second == "messages[2].tool_calls");
}

TEST_CASE("completion requests: text or token ids, one prompt") {
  auto text = parse_completion_request({{"prompt", "1+1="}}, {});
  CHECK(text.prompt_text == "1+1=");
  auto ids = parse_completion_request({{"prompt", {5, 6, 7}}, {"logprobs", 0}}, {});
  CHECK(ids.prompt_ids == std::vector<int64_t>{5, 6, 7});
  CHECK(ids.logprobs);
  auto single = parse_completion_request({{"prompt", ojson::array({ojson::array({1, 2})})}}, {});
  CHECK(single.prompt_ids == std::vector<int64_t>{1, 2});
  CHECK(api_error_of([] { parse_completion_request({{"prompt", {"a", "b"}}}, {}); }).second == "prompt");
  CHECK(api_error_of([] { parse_completion_request({{"max_tokens", 3}}, {}); }).second == "prompt");
  CHECK(parse_completion_request({{"prompt", "x"}, {"logprobs", 2}}, {}).top_logprobs == 2);
  CHECK(api_error_of([] { parse_completion_request({{"prompt", "x"}, {"logprobs", 21}}, {}); }).second == "logprobs");
  RequestLimits small;
  small.max_prompt_tokens = 2;
  CHECK(api_error_of([&] { parse_completion_request({{"prompt", {1, 2, 3}}}, small); }).second == "prompt");
}

TEST_CASE("tool calls: Hermes blocks become calls; anything malformed stays text") {
  auto two = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"time\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}\n</tool_call>");
  REQUIRE(two.tool_calls.size() == 2);
  CHECK(two.content == "Let me check.");
  CHECK(two.tool_calls[0].name == "get");
  CHECK(two.tool_calls[0].arguments == "{\"city\":\"Oslo\"}");
  CHECK(two.tool_calls[1].arguments == "{\"tz\":\"UTC\"}");
  for (const std::string bad : {"<tool_call>{\"name\": \"get\"", "<tool_call>{name: get}</tool_call>",
                                "<tool_call>[1]</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                                "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>", "plain text"}) {
    const auto out = parse_tool_calls(bad);
    CHECK(out.tool_calls.empty());
    CHECK(out.content == bad);
  }
}

TEST_CASE("a choice streams nothing that could still be a stop string, a tool call or half a character") {
  tokenizers::CharTokenizerOptions printable;  // <pad> 0, <bos> 1, <eos> 2, then printable ASCII
  printable.alphabet.clear();
  for (char ch = ' '; ch <= '~'; ++ch) printable.alphabet.push_back(ch);
  tokenizers::CharTokenizer tok(printable);
  auto ids = [&](const std::string& s) { return tok.encode(s); };
  ChoiceState c(tok, {"STOP"}, {2}, false);
  std::string streamed;
  for (auto id : ids("abST")) {
    c.add({0, id, -0.5F, false});
    streamed += c.take_delta();
  }
  CHECK(streamed == "ab");  // "ST" may begin "STOP"
  for (auto id : ids("Ox")) c.add({0, id, -0.5F, false});
  streamed += c.take_delta();
  CHECK(streamed == "abSTOx");
  for (auto id : ids("STOP")) c.add({0, id, -0.5F, false});
  CHECK(c.finished());
  CHECK(c.finish_reason() == "stop");
  CHECK(c.text() == "abSTOx");
  CHECK(c.tokens().size() == 10);  // the ids keep the token that completed the stop string
  streamed += c.take_delta();
  CHECK(streamed == "abSTOx");

  ChoiceState t(tok, {}, {2}, true);
  std::string shown;
  for (auto id : ids("hi <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>")) {
    t.add({0, id, 0.0F, false});
    shown += t.take_delta();
  }
  t.add({0, 2, 0.0F, true});
  shown += t.take_delta();
  CHECK(shown == "hi ");
  CHECK(t.finish_reason() == "tool_calls");
  CHECK(t.message()["content"] == "hi");
  CHECK(t.message()["tool_calls"][0]["function"]["name"] == "f");
}

TEST_CASE("a session becomes rows: turns that extend the context chain, others start a row") {
  Session s{.id = "s", .turns = {}};
  s.turns.push_back(
      {.prompt_ids = {10, 11}, .completion_ids = {20, 21}, .completion_log_probs = {-1, -2}, .weight_version = 3});
  // The next turn's prompt: the context, a tool result (30, 31) the model did not write.
  s.turns.push_back({.prompt_ids = {10, 11, 20, 21, 30, 31},
                     .completion_ids = {22, 23},
                     .completion_log_probs = {-3, -5},
                     .weight_version = 4,
                     .completion_weight_versions = {4, 5}});  // a partial weight update within the turn
  // A sibling of the first turn (n = 2): a row of its own.
  s.turns.push_back(
      {.prompt_ids = {10, 11}, .completion_ids = {25}, .completion_log_probs = {-4}, .weight_version = 3});
  auto dp = session_to_data_proto(s, 0);
  REQUIRE(dp.batch.at("prompts").size(0) == 2);
  CHECK(torch::equal(dp.batch.at("prompts"), torch::tensor({10, 11, 10, 11}, torch::kLong).reshape({2, 2})));
  CHECK(torch::equal(dp.batch.at("responses")[0], torch::tensor({20, 21, 30, 31, 22, 23}, torch::kLong)));
  CHECK(torch::equal(dp.batch.at("response_mask")[0], torch::tensor({1, 1, 0, 0, 1, 1}, torch::kLong)));
  CHECK(torch::allclose(dp.batch.at("rollout_log_probs")[0], torch::tensor({-1.0F, -2.0F, 0.0F, 0.0F, -3.0F, -5.0F})));
  CHECK(torch::equal(dp.batch.at("rollout_weight_versions")[0], torch::tensor({3, 3, -1, -1, 4, 5}, torch::kLong)));
  CHECK(torch::equal(dp.batch.at("rollout_weight_versions")[1], torch::tensor({3, -1, -1, -1, -1, -1}, torch::kLong)));
  CHECK(torch::equal(dp.batch.at("response_mask")[1], torch::tensor({1, 0, 0, 0, 0, 0}, torch::kLong)));
  CHECK(torch::equal(dp.batch.at("attention_mask")[1], torch::tensor({1, 1, 1, 0, 0, 0, 0, 0}, torch::kLong)));
  CHECK(dp.non_tensor_batch.at("weight_versions")[0] == Json::array({3, 4}));
  CHECK(dp.non_tensor_batch.at("session_id")[1] == "s");
  CHECK_THROWS_AS(session_to_data_proto(Session{.id = "e", .turns = {}}, 0), ValueError);
}

TEST_CASE("the session store is bounded in sessions, turns and id length") {
  SessionStore store({.max_sessions = 2, .max_turns = 1, .max_session_id_bytes = 8});
  CHECK(store.record("a", {}));
  CHECK_FALSE(store.record("a", {}));
  store.record("b", {});
  store.record("c", {});  // drops "a", the least recently updated
  CHECK_FALSE(store.get("a"));
  CHECK(store.get("c"));
  CHECK(store.take("b"));
  CHECK_FALSE(store.get("b"));
  CHECK(api_error_of([&] { store.check_id("123456789"); }).second == "X-Session-Id");
  CHECK(api_error_of([&] { store.check_id("a\nb"); }).first == 400);
}

TEST_CASE("a choice's text grows incrementally: multi-byte characters cut by tokens, linear decoding") {
  // Bytes of é (C3 A9), 中 (E4 B8 AD) and 🙂 (F0 9F 99 82); token 256 ends é and starts 中.
  const std::string text = "h\xC3\xA9 \xE4\xB8\xAD\xF0\x9F\x99\x82";
  const auto tok = byte_bpe({"\xA9 \xE4"});
  std::vector<int64_t> ids{'h', 0xC3, 256, 0xB8, 0xAD, 0xF0, 0x9F, 0x99, 0x82};
  REQUIRE(tok.decode(ids) == text);
  ChoiceState c(tok, {"\xF0\x9F\x99\x82?"}, {}, false);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    c.add({0, ids[i], 0.0F, false, 0});
    const auto delta = c.take_delta();
    CHECK(delta.find("\xEF\xBF\xBD") == std::string::npos);  // never half a character, never U+FFFD
    streamed += delta;
    // Whenever the tokens so far end on a whole character, the text is their full decoding.
    const std::vector<int64_t> so_far(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    const auto full = tok.decode(so_far);
    if (full.find("\xEF\xBF\xBD") == std::string::npos) CHECK(c.text() == full);
  }
  c.add({0, '?', 0.0F, true, 0});  // completes the stop string across the multi-byte character
  CHECK(c.finished());
  CHECK(c.finish_reason() == "stop");
  CHECK(c.text() == "h\xC3\xA9 \xE4\xB8\xAD");
  streamed += c.take_delta();
  CHECK(streamed == c.text());

  // Each token is decoded a bounded number of times: 2000 tokens cost ~2000 decoded ids, not ~2 million.
  CountingTokenizer counting(tok);
  ChoiceState long_choice(counting, {"STOP"}, {}, false);
  for (int i = 0; i < 2000; ++i) {
    const int64_t id = i % 3 == 0 ? 0xC3 : i % 3 == 1 ? 0xA9 : 'x';
    long_choice.add({0, id, 0.0F, false, 0});
    long_choice.take_delta();
  }
  CHECK(long_choice.text() == tok.decode(long_choice.tokens()));
  CHECK(counting.decoded < 4 * 2000);
}
