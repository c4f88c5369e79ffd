#include <hyflow/models/config.hpp>

#include <hyflow/core/error.hpp>

#include <fstream>

namespace hyflow::models {
namespace {

using Json = nlohmann::json;

template <class T>
T required(const Json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) {
    throw FormatError(source + ": missing required key '" + key + "'");
  }
  try {
    return j.at(key).get<T>();
  } catch (const Json::exception& e) {
    throw FormatError(source + ": key '" + key + "' has the wrong type: " + e.what());
  }
}

template <class T>
T optional_key(const Json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  return required<T>(j, key, source);
}

std::vector<int64_t> id_list(const Json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return {};
  if (j.at(key).is_array()) return required<std::vector<int64_t>>(j, key, source);
  return {required<int64_t>(j, key, source)};
}

}  // namespace

int64_t ModelConfig::resolved_pad_token_id() const {
  if (pad_token_id >= 0) return pad_token_id;
  if (!eos_token_ids.empty()) return eos_token_ids.front();
  return 0;
}

void ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* name) {
    if (v <= 0) throw ValueError(std::string("ModelConfig: ") + name + " must be > 0, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  if (num_attention_heads % num_key_value_heads != 0) {
    throw ValueError("ModelConfig: num_attention_heads (" + std::to_string(num_attention_heads) +
                     ") must be a multiple of num_key_value_heads (" + std::to_string(num_key_value_heads) + ")");
  }
  if (head_dim <= 0 && hidden_size % num_attention_heads != 0) {
    throw ValueError("ModelConfig: hidden_size (" + std::to_string(hidden_size) +
                     ") must be divisible by num_attention_heads (" + std::to_string(num_attention_heads) + ")");
  }
  if (resolved_head_dim() % 2 != 0) {
    throw ValueError("ModelConfig: head_dim must be even for rotary embeddings, got " +
                     std::to_string(resolved_head_dim()));
  }
  if (rope_scaling.type != "none" && rope_scaling.type != "linear") {
    throw ValueError("ModelConfig: rope_scaling type '" + rope_scaling.type + "' is not supported (none, linear)");
  }
  if (!(rope_scaling.factor > 0)) throw ValueError("ModelConfig: rope_scaling factor must be > 0");
  if (torch_dtype != "float32" && torch_dtype != "bfloat16" && torch_dtype != "float16") {
    throw ValueError("ModelConfig: torch_dtype '" + torch_dtype + "' is not supported (float32, bfloat16, float16)");
  }
}

int64_t ModelConfig::num_parameters() const {
  const int64_t d = hidden_size, hd = resolved_head_dim();
  const int64_t q = num_attention_heads * hd, kv = num_key_value_heads * hd;
  int64_t attn = d * q + 2 * d * kv + q * d + (qkv_bias ? q + 2 * kv : 0) + (o_bias ? d : 0);
  int64_t mlp = 3 * d * intermediate_size + (mlp_bias ? 2 * intermediate_size + d : 0);
  int64_t layer = attn + mlp + 2 * d;
  int64_t embed = vocab_size * d;
  return embed + num_hidden_layers * layer + d + (tie_word_embeddings ? 0 : embed);
}

ModelConfig config_from_json(const Json& j, const std::string& source) {
  if (!j.is_object()) throw FormatError(source + ": config must be a JSON object");
  ModelConfig c;
  auto archs = optional_key<std::vector<std::string>>(j, "architectures", {}, source);
  std::string model_type = optional_key<std::string>(j, "model_type", "", source);
  if (!archs.empty()) {
    c.architecture = archs.front();
  } else if (model_type == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
  } else if (model_type == "llama") {
    c.architecture = "LlamaForCausalLM";
  }
  const bool qwen2 = c.architecture.rfind("Qwen2", 0) == 0;
  const bool llama = c.architecture.rfind("Llama", 0) == 0;
  if (!qwen2 && !llama) {
    throw FormatError(source + ": architecture '" + c.architecture +
                      "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM and their heads)");
  }
  c.vocab_size = required<int64_t>(j, "vocab_size", source);
  c.hidden_size = required<int64_t>(j, "hidden_size", source);
  c.intermediate_size = required<int64_t>(j, "intermediate_size", source);
  c.num_hidden_layers = required<int64_t>(j, "num_hidden_layers", source);
  c.num_attention_heads = required<int64_t>(j, "num_attention_heads", source);
  c.num_key_value_heads = optional_key<int64_t>(j, "num_key_value_heads", c.num_attention_heads, source);
  c.head_dim = optional_key<int64_t>(j, "head_dim", 0, source);
  c.max_position_embeddings = optional_key<int64_t>(j, "max_position_embeddings", 2048, source);
  c.rms_norm_eps = optional_key<double>(j, "rms_norm_eps", 1e-6, source);
  c.rope_theta = optional_key<double>(j, "rope_theta", 10000.0, source);
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
    const auto& rs = j.at("rope_scaling");
    std::string type = rs.contains("rope_type") ? optional_key<std::string>(rs, "rope_type", "", source)
                                                : optional_key<std::string>(rs, "type", "", source);
    if (type == "default") type = "none";
    if (type != "linear" && type != "none") {
      throw FormatError(source + ": rope_scaling type '" + type + "' is not supported (linear)");
    }
    c.rope_scaling = {.type = type, .factor = optional_key<double>(rs, "factor", 1.0, source)};
  }
  if (qwen2) {
    c.qkv_bias = true;
  } else {
    c.qkv_bias = c.o_bias = optional_key<bool>(j, "attention_bias", false, source);
    c.mlp_bias = optional_key<bool>(j, "mlp_bias", false, source);
  }
  c.tie_word_embeddings = optional_key<bool>(j, "tie_word_embeddings", false, source);
  c.initializer_range = optional_key<double>(j, "initializer_range", 0.02, source);
  c.bos_token_id = optional_key<int64_t>(j, "bos_token_id", -1, source);
  c.eos_token_ids = id_list(j, "eos_token_id", source);
  c.pad_token_id = optional_key<int64_t>(j, "pad_token_id", -1, source);
  c.torch_dtype = optional_key<std::string>(j, "torch_dtype", "float32", source);
  try {
    c.validate();
  } catch (const ValueError& e) {
    throw FormatError(source + ": " + e.what());
  }
  return c;
}

Json config_to_json(const ModelConfig& c) {
  const bool qwen2 = c.architecture.rfind("Qwen2", 0) == 0;
  Json j = {
      {"architectures", {c.architecture}},
      {"model_type", qwen2 ? "qwen2" : "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"initializer_range", c.initializer_range},
      {"torch_dtype", c.torch_dtype},
  };
  if (c.head_dim > 0) j["head_dim"] = c.head_dim;
  j["rope_scaling"] = c.rope_scaling.type == "none"
                          ? Json(nullptr)
                          : Json{{"type", c.rope_scaling.type}, {"rope_type", c.rope_scaling.type},
                                 {"factor", c.rope_scaling.factor}};
  if (!qwen2) {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = c.mlp_bias;
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids.front();
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
  return j;
}

ModelConfig load_config(const std::filesystem::path& path) {
  auto file = std::filesystem::is_directory(path) ? path / "config.json" : path;
  std::ifstream in(file);
  if (!in) throw FormatError(file.string() + ": cannot open config");
  Json j;
  try {
    in >> j;
  } catch (const Json::exception& e) {
    throw FormatError(file.string() + ": invalid JSON: " + e.what());
  }
  return config_from_json(j, file.string());
}

void save_config(const ModelConfig& config, const std::filesystem::path& file) {
  std::ofstream out(file);
  if (!out) throw Error(file.string() + ": cannot write config");
  out << config_to_json(config).dump(2) << "\n";
  if (!out) throw Error(file.string() + ": write failed");
}

ModelConfig tiny_config(int64_t vocab_size, int64_t pad_token_id, int64_t eos_token_id) {
  return ModelConfig{
      .architecture = "Qwen2ForCausalLM",
      .vocab_size = vocab_size,
      .hidden_size = 128,
      .intermediate_size = 384,
      .num_hidden_layers = 4,
      .num_attention_heads = 4,
      .num_key_value_heads = 2,
      .max_position_embeddings = 512,
      .rope_theta = 10000.0,
      .qkv_bias = true,
      .tie_word_embeddings = true,
      .eos_token_ids = {eos_token_id},
      .pad_token_id = pad_token_id,
  };
}

ModelConfig bench_50m_config() {
  return ModelConfig{
      .architecture = "LlamaForCausalLM",
      .vocab_size = 32000,
      .hidden_size = 512,
      .intermediate_size = 1536,
      .num_hidden_layers = 10,
      .num_attention_heads = 8,
      .num_key_value_heads = 4,
      .max_position_embeddings = 2048,
      .rope_theta = 500000.0,
      .tie_word_embeddings = true,
      .bos_token_id = 1,
      .eos_token_ids = {2},
      .pad_token_id = 0,
  };
}

}  // namespace hyflow::models
