#pragma once
// The tokenizer of a model folder: tokenizer_config.json naming hyflow's character tokenizer
// ("tokenizer_class": "hyflow-char", optional "alphabet"), else a Hugging Face tokenizer.json.

#include <hyflow/tokenizers/tokenizer.hpp>

#include <memory>
#include <string>

namespace hyflow::tokenizers {

/// FormatError naming the folder when it holds neither, or a file that does not parse.
std::shared_ptr<const Tokenizer> read_tokenizer_files(const std::string& model_dir);

}  // namespace hyflow::tokenizers
