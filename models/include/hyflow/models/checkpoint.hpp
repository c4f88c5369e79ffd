#pragma once
// Hugging Face checkpoint directories: config.json plus model.safetensors, or shards
// model-00001-of-0000N.safetensors with model.safetensors.index.json.

#include <hyflow/models/config.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/models/safetensors.hpp>

#include <c10/core/ScalarType.h>

#include <filesystem>
#include <optional>

namespace hyflow::models {

struct SaveOptions {
  std::optional<at::ScalarType> dtype;  ///< convert floating tensors; keep as they are when unset
  int64_t max_shard_bytes = 0;          ///< > 0: shard when the total exceeds it
};

struct LoadOptions {
  std::optional<at::ScalarType> dtype;  ///< model dtype; default: the checkpoint's tensors' dtype
};

/// Every tensor of a checkpoint directory (single file or sharded through the index).
/// FormatError names the file (and tensor) on malformed input, missing shards included.
NamedTensors load_checkpoint_tensors(const std::filesystem::path& dir);

/// Writes config.json and the module's parameters (Hugging Face names) into `dir`
/// (created if needed). The config's torch_dtype follows options.dtype.
void save_pretrained(const torch::nn::Module& module, ModelConfig config, const std::filesystem::path& dir,
                     const SaveOptions& options = {});

/// Copies `tensors` into the module's parameters by name. Every parameter must be present
/// with its exact shape (FormatError naming `source` and the tensor otherwise), except
/// those whose name starts with one of `may_be_missing`. Unused tensors are ignored
/// (e.g. lm_head.weight when loading a value model from an LM checkpoint).
void load_parameters(torch::nn::Module& module, const NamedTensors& tensors, const std::string& source,
                     const std::vector<std::string>& may_be_missing = {});

/// Loads a causal LM (LlamaForCausalLM / Qwen2ForCausalLM) from a checkpoint directory.
CausalLM load_causal_lm(const std::filesystem::path& dir, const LoadOptions& options = {});

/// Loads a value/score model: the transformer from an LM or token-classification
/// checkpoint; `score` from the checkpoint when present, else freshly initialized.
ValueModel load_value_model(const std::filesystem::path& dir, const LoadOptions& options = {});

}  // namespace hyflow::models
