// BpeTokenizer against Hugging Face's tokenizers library (Rust, through its Node binding):
// tokenizer_reference.json is written by make_tokenizer_reference.mjs next to it.
#include <hyflow/tokenizers/bpe_tokenizer.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

using namespace hyflow;
using namespace hyflow::tokenizers;

namespace {

const std::filesystem::path kData = HYFLOW_TOKENIZERS_TEST_DATA;

const nlohmann::json& base_json() {
  static const nlohmann::json j = [] {
    std::ifstream in(kData / "qwen2_5" / "tokenizer.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}

const BpeTokenizer& qwen() {
  static const BpeTokenizer tok(base_json(), "qwen2_5/tokenizer.json");
  return tok;
}

const nlohmann::json& reference() {
  static const nlohmann::json j = [] {
    std::ifstream in(kData / "tokenizer_reference.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}

// A byte-level tokenizer without merges and with the given normalizer: cheap to build.
BpeTokenizer byte_tokenizer(const nlohmann::json& normalizer) {
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", nlohmann::json::object()}, {"merges", nlohmann::json::array()}}},
      {"normalizer", normalizer},
      {"pre_tokenizer", base_json()["pre_tokenizer"]},
      {"decoder", base_json()["decoder"]}};
  for (const auto& [token, id] : base_json()["model"]["vocab"].items()) {
    if (id.get<int64_t>() < 256) j["model"]["vocab"][token] = id;
  }
  return BpeTokenizer(j, "byte-level " + normalizer.dump());
}

std::string utf8(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

void report(const char* what, size_t agree, size_t total) {
  std::printf("reference agreement, %s: %zu/%zu\n", what, agree, total);
}

}  // namespace

TEST_CASE("Qwen2.5 encodings equal Hugging Face tokenizers' on the corpus and the generated cases") {
  const auto& cases = reference()["cases"];
  REQUIRE(cases.size() >= 250);
  size_t agree = 0;
  for (const auto& c : cases) {
    const auto text = c["text"].get<std::string>();
    INFO("text: " << text);
    const auto ids = qwen().encode(text);
    CHECK(ids == c["ids"].get<std::vector<int64_t>>());
    CHECK(qwen().encode(text) == ids);  // now with every piece of at most 256 bytes in the word cache
    agree += ids == c["ids"].get<std::vector<int64_t>>();
  }
  report("encode", agree, cases.size());
}

TEST_CASE("decoding the reference ids gives Hugging Face's text, and decode inverts encode") {
  const auto& cases = reference()["cases"];
  size_t agree = 0;
  for (const auto& c : cases) {
    const auto text = c["text"].get<std::string>();
    INFO("text: " << text);
    const auto decoded = qwen().decode(c["ids"].get<std::vector<int64_t>>());
    CHECK(decoded == c["decoded"].get<std::string>());
    agree += decoded == c["decoded"].get<std::string>();
  }
  report("decode", agree, cases.size());
}

TEST_CASE("undecodable byte sequences give one U+FFFD per maximal invalid subpart, like the reference") {
  const auto& decodes = reference()["decodes"];
  REQUIRE(decodes.size() >= 100);
  size_t agree = 0;
  for (const auto& d : decodes) {
    const auto ids = d["ids"].get<std::vector<int64_t>>();
    INFO("ids: " << d["ids"].dump() << " skip_special: " << d["skip_special"]);
    const auto text = qwen().decode(ids, d["skip_special"].get<bool>());
    CHECK(text == d["text"].get<std::string>());
    agree += text == d["text"].get<std::string>();
  }
  report("byte decode", agree, decodes.size());
}

TEST_CASE("long repeated words encode to the reference ids") {
  for (const auto& l : reference()["long"]) {
    const auto unit = l["unit"].get<std::string>();
    const auto count = l["count"].get<size_t>();
    INFO("unit: " << unit << " x " << count);
    std::string text;
    for (size_t i = 0; i < count; ++i) text += unit;
    std::vector<int64_t> expected;
    for (const auto& run : l["ids_rle"]) expected.insert(expected.end(), run[1].get<size_t>(), run[0].get<int64_t>());
    const auto ids = qwen().encode(text);
    CHECK(ids == expected);
    CHECK(qwen().decode(ids) == text);
    CHECK(qwen().encode(text) == ids);
  }
}

TEST_CASE("NFC, NFD, NFKC and NFKD normalize each code point like the reference (its Unicode 9.0 data)") {
  const auto& ref = reference();
  REQUIRE(ref["normalization_probes"].size() == 3);
  const auto forms = ref["normalization_forms"].get<std::vector<std::string>>();
  std::vector<BpeTokenizer> tokenizers;
  for (const auto& form : forms) tokenizers.push_back(byte_tokenizer({{"type", form}}));
  size_t agree = 0, total = 0;
  for (const auto& n : ref["normalization"]) {
    const auto c = utf8(n["cp"].get<char32_t>());
    const std::string probes[3] = {c, "x" + c + "\u0334", "x\u0301" + c};
    for (size_t p = 0; p < 3; ++p) {
      for (size_t f = 0; f < forms.size(); ++f) {
        const auto& expected = n["results"][p][f];
        const auto want = expected.is_null() ? probes[p] : expected.get<std::string>();
        const auto got = tokenizers[f].normalize(probes[p]);
        INFO("U+" << std::hex << n["cp"].get<uint32_t>() << std::dec << " probe " << p << " " << forms[f]);
        CHECK(got == want);
        ++total;
        agree += got == want;
      }
    }
  }
  REQUIRE(total >= 10000);
  report("normalization probes", agree, total);
}

TEST_CASE("tokenizer variants (normalizers, added tokens, a repeated merge, Llama 3 split) encode like the reference") {
  size_t agree = 0, total = 0;
  for (const auto& v : reference()["variants"]) {
    const auto name = v["name"].get<std::string>();
    INFO("variant: " << name);
    auto j = base_json();
    if (v.contains("normalizer")) j["normalizer"] = v["normalizer"];
    if (v.contains("added_tokens")) {
      for (const auto& t : v["added_tokens"]) j["added_tokens"].push_back(t);
    }
    if (v.contains("pattern")) j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = v["pattern"];
    if (v.contains("repeat_merge")) {
      j["model"]["merges"].push_back(j["model"]["merges"][v["repeat_merge"].get<size_t>()]);
    }
    std::optional<BpeTokenizer> tok;
    CHECK_NOTHROW(tok.emplace(j, name));
    for (const auto& c : v["cases"]) {
      ++total;
      if (!tok) continue;
      const auto text = c["text"].get<std::string>();
      INFO("text: " << text);
      const auto ids = tok->encode(text);
      CHECK(ids == c["ids"].get<std::vector<int64_t>>());
      agree += ids == c["ids"].get<std::vector<int64_t>>();
    }
  }
  report("variants", agree, total);
}
