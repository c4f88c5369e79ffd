#include <hyflow/tokenizers/tokenizer_files.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/tokenizers/bpe_tokenizer.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace hyflow::tokenizers {

std::shared_ptr<const Tokenizer> read_tokenizer_files(const std::string& model_dir) {
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
    if (cls != cfg.end() && cls->is_string() && cls->get<std::string>() == "hyflow-char") {
      CharTokenizerOptions o;
      if (cfg.contains("alphabet") && cfg.at("alphabet").is_string())
        o.alphabet = cfg.at("alphabet").get<std::string>();
      return std::make_shared<CharTokenizer>(o);
    }
  }
  if (std::filesystem::exists(dir / "tokenizer.json"))
    return std::make_shared<BpeTokenizer>(BpeTokenizer::from_file(dir / "tokenizer.json"));
  throw FormatError("model directory '" + model_dir + "' has no tokenizer (tokenizer_config.json or tokenizer.json)");
}

}  // namespace hyflow::tokenizers
