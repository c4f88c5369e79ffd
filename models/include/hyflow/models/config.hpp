#pragma once
// Configuration of a decoder-only transformer of the Llama / Qwen2 family, read from and
// written to Hugging Face's config.json.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace hyflow::models {

/// rope_scaling of config.json: none, or "linear" (positions divided by factor).
struct RopeScaling {
  std::string type = "none";  ///< "none" | "linear"
  double factor = 1.0;
};

/// Every field has the meaning (and the config.json key) of Hugging Face's LlamaConfig /
/// Qwen2Config. head_dim 0 means hidden_size / num_attention_heads.
struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  ///< or "Qwen2ForCausalLM"
  int64_t vocab_size = 32000;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 1536;
  int64_t num_hidden_layers = 8;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool qkv_bias = false;  ///< Qwen2: always true; Llama: attention_bias
  bool o_bias = false;    ///< Llama attention_bias also biases o_proj
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  int64_t bos_token_id = -1;  ///< -1: none
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = -1;     ///< -1: none (generation falls back to the first eos)
  std::string torch_dtype = "float32";  ///< "float32" | "bfloat16" | "float16"

  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  /// The pad id generation uses: pad_token_id, else the first eos id, else 0.
  int64_t resolved_pad_token_id() const;
  /// Throws hyflow::ValueError naming the field when sizes do not fit together.
  void validate() const;
  /// Number of parameters of the causal LM built from this config.
  int64_t num_parameters() const;
};

/// Parses a config.json object. Unknown architectures or model types, unsupported
/// rope_scaling and missing required keys raise FormatError naming `source` and the key.
ModelConfig config_from_json(const nlohmann::json& json, const std::string& source = "config.json");
/// The config.json object Hugging Face writes for this config.
nlohmann::json config_to_json(const ModelConfig& config);
/// Reads <dir>/config.json (or the file itself when `path` is a file).
ModelConfig load_config(const std::filesystem::path& path);
void save_config(const ModelConfig& config, const std::filesystem::path& file);

/// The tiny model for built-in synthetic tasks (fast on 2 CPU cores): d=128, 4 layers,
/// 4 heads (2 KV heads), SwiGLU 384, tied embeddings, Qwen2 style (QKV bias).
ModelConfig tiny_config(int64_t vocab_size, int64_t pad_token_id = 0, int64_t eos_token_id = 2);
/// A ~48M-parameter Llama-style config (d=512, 10 layers, GQA 8/4, vocab 32000, tied) for
/// benchmarks.
ModelConfig bench_50m_config();

}  // namespace hyflow::models
