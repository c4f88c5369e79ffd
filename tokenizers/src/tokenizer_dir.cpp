#include <hyflow/core/error.hpp>
#include <hyflow/tokenizers/bpe_tokenizer.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/tokenizers/tokenizer_dir.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace hyflow::tokenizers {
namespace {

void read_string(const nlohmann::json& cfg, const std::string& file, const char* key, std::string& out) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return;
  if (!it->is_string()) throw FormatError("'" + file + "': " + key + " must be a string, got " + it->dump());
  out = it->get<std::string>();
}

std::shared_ptr<const Tokenizer> char_tokenizer(const nlohmann::json& cfg, const std::string& file) {
  CharTokenizerOptions o;
  read_string(cfg, file, "alphabet", o.alphabet);
  read_string(cfg, file, "eos_token", o.eos_token);
  read_string(cfg, file, "pad_token", o.pad_token);
  if (auto it = cfg.find("special_tokens"); it != cfg.end() && !it->is_null()) {
    if (!it->is_array()) throw FormatError("'" + file + "': special_tokens must be a list, got " + it->dump());
    o.special_tokens.clear();
    for (const auto& t : *it) {
      if (!t.is_string()) throw FormatError("'" + file + "': special_tokens holds a non-string " + t.dump());
      o.special_tokens.push_back(t.get<std::string>());
    }
  }
  return std::make_shared<CharTokenizer>(o);
}

}  // namespace

std::shared_ptr<const Tokenizer> read_tokenizer_dir(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    const std::string file = (dir / "tokenizer_config.json").string();
    std::ifstream in(file);
    if (!in) throw FormatError("cannot open '" + file + "'");
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError("'" + file + "' is not valid JSON: " + e.what());
    }
    if (!cfg.is_object()) throw FormatError("'" + file + "' must hold a JSON object, got " + cfg.type_name());
    const auto cls = cfg.find("tokenizer_class");
    if (cls != cfg.end() && !cls->is_string() && !cls->is_null())
      throw FormatError("'" + file + "': tokenizer_class must be a string, got " + cls->dump());
    if (cls != cfg.end() && cls->is_string() && cls->get<std::string>() == "hyflow-char")
      return char_tokenizer(cfg, file);
  }
  if (std::filesystem::exists(dir / "tokenizer.json"))
    return std::make_shared<BpeTokenizer>(BpeTokenizer::from_file(dir / "tokenizer.json"));
  throw FormatError("model directory '" + model_dir + "' has no tokenizer (tokenizer_config.json or tokenizer.json)");
}

}  // namespace hyflow::tokenizers
