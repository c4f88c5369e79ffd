#pragma once
// The tokenizer of a model directory, for every module that needs one (the trainer's datasets,
// the rollout worker's agent loops).

#include <hyflow/tokenizers/tokenizer.hpp>

#include <memory>
#include <string>

namespace hyflow::tokenizers {

/// tokenizer_config.json with tokenizer_class "hyflow-char" gives the char tokenizer with the
/// file's optional "alphabet", "special_tokens" (a list), "eos_token" and "pad_token"
/// (CharTokenizerOptions' fields; e.g. ["<pad>", "<|im_start|>", "<|im_end|>"] and "<|im_end|>"
/// for chat templates), else tokenizer.json (BPE). FormatError naming the directory when
/// neither is there, naming the file and the field when tokenizer_config.json is not a JSON
/// object or a field has the wrong type.
std::shared_ptr<const Tokenizer> read_tokenizer_dir(const std::string& model_dir);

}  // namespace hyflow::tokenizers
