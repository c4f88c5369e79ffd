#include <hyflow/core/error.hpp>
#include <hyflow/tokenizers/bpe_tokenizer.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/tokenizers/chat_template.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <fstream>

using namespace hyflow;
using namespace hyflow::tokenizers;

namespace {

const std::filesystem::path kData = HYFLOW_TOKENIZERS_TEST_DATA;

const BpeTokenizer& qwen() {
  static const BpeTokenizer tok = BpeTokenizer::from_file(kData / "qwen2_5" / "tokenizer.json");
  return tok;
}

}  // namespace

TEST_CASE("the pre-tokenizer splits like the Qwen2 regex") {
  using V = std::vector<std::string>;
  CHECK(qwen().pre_tokenize("Hello world") == V{"Hello", " world"});
  CHECK(qwen().pre_tokenize("a  b") == V{"a", " ", " b"});
  CHECK(qwen().pre_tokenize("x\n\ny") == V{"x", "\n\n", "y"});
  CHECK(qwen().pre_tokenize("2024!") == V{"2", "0", "2", "4", "!"});
  CHECK(qwen().pre_tokenize("it's ok") == V{"it", "'s", " ok"});
  CHECK(qwen().pre_tokenize("end   ") == V{"end", "   "});
  CHECK(qwen().pre_tokenize(" ?!\n\nnext") == V{" ?!\n\n", "next"});
  CHECK(qwen().pre_tokenize("Привет мир") == V{"Привет", " мир"});
}

TEST_CASE("special tokens are recognized in text, kept or skipped when decoding") {
  const auto ids = qwen().encode("<|im_start|>user\nhi<|im_end|>");
  REQUIRE(ids.size() >= 3);
  CHECK(ids.front() == 151644);
  CHECK(ids.back() == 151645);
  CHECK(qwen().decode(ids, /*skip_special_tokens=*/true) == "user\nhi");
  CHECK(qwen().eos_token_id() == 151645);  // from tokenizer_config.json
  CHECK(qwen().pad_token_id() == 151643);
  CHECK(qwen().token_to_id("<|endoftext|>") == 151643);
  CHECK_THROWS_WITH(qwen().decode({-1}), Catch::Contains("-1"));
}

TEST_CASE("invalid UTF-8 bytes survive encoding and decode to the replacement character") {
  const std::string bytes = "ok\xff\xfe!";
  auto ids = qwen().encode(bytes);
  CHECK(qwen().decode(ids) == "ok\xEF\xBF\xBD\xEF\xBF\xBD!");
}

TEST_CASE("the Qwen2.5 chat template is the default: its system turn, then ChatML turns") {
  const std::string expected =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
      "<|im_start|>assistant\n";
  CHECK(apply_chatml({{"system", "You are a helpful assistant."}, {"user", "What is 2+2?"}}) == expected);
  CHECK(apply_chatml({{"user", "hi"}, {"assistant", "hello"}}, {.add_generation_prompt = false}) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n");
  CHECK_THROWS_WITH(apply_chatml({{"robot", "x"}}), Catch::Contains("robot"));
}

TEST_CASE("malformed tokenizer.json is rejected naming the field") {
  nlohmann::json j = {{"model", {{"type", "Unigram"}}}};
  CHECK_THROWS_WITH(BpeTokenizer(j, "t.json"), Catch::Contains("t.json") && Catch::Contains("model.type"));
  CHECK_THROWS_AS(BpeTokenizer::from_file(kData / "does-not-exist.json"), FormatError);
}

TEST_CASE("character tokenizer: specials first, round trip, unknown characters named") {
  CharTokenizer tok;
  CHECK(tok.pad_token_id() == 0);
  CHECK(tok.eos_token_id() == 2);
  const std::string text = "12+34=46<eos>";
  auto ids = tok.encode(text);
  CHECK(ids.size() == 9);
  CHECK(ids.back() == 2);
  CHECK(tok.decode(ids) == text);
  CHECK(tok.decode(ids, true) == "12+34=46");
  CHECK_THROWS_WITH(tok.encode("1~2"), Catch::Contains("byte 1"));
  CHECK_THROWS_AS(CharTokenizer({.alphabet = "aa"}), ValueError);
}

TEST_CASE("the chat char tokenizer encodes a rendered Qwen2.5 turn: markers one id each, <|im_end|> ends") {
  const CharTokenizer tok(chat_char_options());
  CHECK(tok.vocab_size() == 3 + 95 + 1);  // specials, printable ASCII, newline
  CHECK(tok.eos_token_id() == *tok.token_to_id("<|im_end|>"));
  CHECK(tok.pad_token_id() == 0);
  ChatTemplateOptions chat;
  chat.default_system = "Use the calculator.";
  const std::string text = apply_chatml({{"user", "1234*5678="}}, chat);
  const auto ids = tok.encode(text);
  CHECK(ids.size() == 58);  // the agent job's prompt (docs/agents.md, "A compact prompt")
  CHECK(ids.front() == *tok.token_to_id("<|im_start|>"));
  CHECK(tok.decode(ids) == text);
  CHECK(tok.encode("{\"expression\": \"(1+2)*3\"}").size() == 25);  // the calls' JSON characters
  CHECK_THROWS_AS(tok.encode("\t"), ValueError);
}

TEST_CASE("prompts are left-padded with verl's position ids") {
  CharTokenizer tok;
  auto batch = encode_prompts(tok, {"1+1=", "12+30="});
  const auto& ids = batch.batch["input_ids"];
  CHECK(ids.sizes() == torch::IntArrayRef({2, 6}));
  CHECK(ids[0][0].item<int64_t>() == tok.pad_token_id());
  CHECK(torch::equal(batch.batch["attention_mask"][0], torch::tensor({0, 0, 1, 1, 1, 1})));
  CHECK(torch::equal(batch.batch["position_ids"][0], torch::tensor({0, 0, 0, 1, 2, 3})));
  CHECK_THROWS_WITH(encode_prompts(tok, {"1+1="}, 2), Catch::Contains("4 tokens"));
}

TEST_CASE("the Llama 3 split pattern groups up to three digits per piece") {
  std::ifstream in(kData / "qwen2_5" / "tokenizer.json");
  auto j = nlohmann::json::parse(in);
  auto& pattern = j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
  auto text = pattern.get<std::string>();
  const auto at = text.find("\\p{N}|");
  REQUIRE(at != std::string::npos);
  pattern = text.replace(at, 6, "\\p{N}{1,3}|");
  BpeTokenizer llama3_split(j, "llama3-style");
  using V = std::vector<std::string>;
  CHECK(llama3_split.pre_tokenize("x1234567") == V{"x", "123", "456", "7"});
  CHECK(llama3_split.decode(llama3_split.encode("year 2024: 10000 items")) == "year 2024: 10000 items");
  pattern = "\\w+";
  CHECK_THROWS_WITH(BpeTokenizer(j, "custom"), Catch::Contains("pre_tokenizer"));
}
