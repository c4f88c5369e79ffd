#pragma once
// LoRA adapters (PEFT's "LORA"): a low-rank update y = x W^T + b + (alpha / r) * B(A(dropout(x)))
// on the chosen linear layers of a model, the base weights frozen. The adapter matrices are
// child modules of the adapted nn::Linear named lora_A (r x in) and lora_B (out x r), so the
// parameter names are PEFT's without its "base_model.model." prefix
// (model.layers.0.self_attn.q_proj.lora_A.weight). Guide: docs/lora.md.

#include <hyflow/models/config.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/models/safetensors.hpp>

#include <torch/nn/module.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::models {

/// verl's model.lora_rank / lora_alpha / target_modules / exclude_modules (+ PEFT's lora_dropout).
struct LoraConfig {
  int64_t rank = 0;  ///< 0: no adapters (full fine-tuning)
  double alpha = 16.0;
  double dropout = 0.0;
  /// "all-linear" (every linear layer but the output head) or module names; a name matches a
  /// module whose path equals it or ends with "." + name (PEFT's rule).
  std::vector<std::string> target_modules = {"all-linear"};
  std::vector<std::string> exclude_modules;

  bool enabled() const { return rank > 0; }
  double scale() const { return alpha / static_cast<double>(rank); }
  /// ValueError naming `path` + the key when a value is out of range.
  void validate(const std::string& path) const;
};

/// The lora_A child of an adapted linear layer: A's weight plus the branch's scale and dropout.
class LoraAImpl : public torch::nn::LinearImpl {
 public:
  LoraAImpl(int64_t in, int64_t rank, double scale, double dropout);
  double scale;
  double dropout;
};

/// Adds adapters to the linear layers of `root` that `config` targets, initialized as PEFT does
/// (A kaiming-uniform with a = sqrt(5), B zeros: the model's outputs do not change), and freezes
/// every other parameter except those under `modules_to_save` (module names, trained in full:
/// the value head "score"). The output head (lm_head, score) is never an "all-linear" target.
/// Returns the adapted modules' paths. ValueError when nothing matches, when a target names a
/// module that is not a linear layer, or when the model already has adapters. A's values come from
/// a generator seeded with `seed` when given (the same adapters on every rank and run), else from
/// torch's default generator.
std::vector<std::string> apply_lora(torch::nn::Module& root, const LoraConfig& config,
                                    const std::vector<std::string>& modules_to_save = {},
                                    std::optional<uint64_t> seed = std::nullopt);

/// The paths of the adapted linear layers of `root` (empty: no adapters).
std::vector<std::string> lora_modules(const torch::nn::Module& root);
bool has_lora(const torch::nn::Module& root);
/// The parameters with requires_grad, in named_parameters order (adapters and modules_to_save
/// under LoRA; every parameter otherwise).
std::vector<at::Tensor> trainable_parameters(const torch::nn::Module& root);
NamedTensors named_trainable_parameters(const torch::nn::Module& root);

/// While alive, forwards on this thread skip every adapter: the base model's outputs, bit for bit
/// (the reference policy of a LoRA actor). Nests.
class DisableAdapters {
 public:
  DisableAdapters();
  ~DisableAdapters();
  DisableAdapters(const DisableAdapters&) = delete;
  DisableAdapters& operator=(const DisableAdapters&) = delete;

 private:
  bool previous_;
};
/// False inside a DisableAdapters on this thread.
bool adapters_enabled();

/// The adapter branch of `layer` added to `base` (= x W^T + b); `base` itself when `layer` has no
/// adapter or adapters are disabled. The models' linear layers call it.
at::Tensor add_lora(const torch::nn::LinearImpl& layer, const at::Tensor& x, at::Tensor base);

/// W + (alpha / r) B A of an adapted layer (its weight when not adapted), detached.
at::Tensor merged_weight(const torch::nn::LinearImpl& layer);
/// Every parameter of `root` but the adapters', adapted weights merged: a plain model's state
/// (Hugging Face names).
NamedTensors merged_parameters(const torch::nn::Module& root);

/// A plain causal LM computing what the adapted `policy` computes, for a rollout engine that reads
/// linear weights directly: non-adapted parameters share the policy's storage (its StorageImpl:
/// an FSDP gather into it is seen here), adapted weights hold W + s B A once refresh() ran (the
/// constructor does not read the policy's values). refresh() re-merges the layers whose adapter
/// changed since the last call (by the adapters' version counters; `force`: every layer, for
/// writers that bump none, e.g. an FSDP gather) in place, so the version counters the decode
/// engine checks move, and returns how many it wrote.
class MergedCopy {
 public:
  explicit MergedCopy(const CausalLM& policy);
  int64_t refresh(bool force = false);
  CausalLM model() const { return merged_; }

 private:
  struct Entry {
    const torch::nn::LinearImpl* source;
    at::Tensor target;
    int64_t version_a = -1, version_b = -1;
  };
  CausalLM policy_;
  CausalLM merged_;
  std::vector<Entry> entries_;
};

/// PEFT's adapter_config.json fields this code reads and writes.
struct AdapterFileConfig {
  LoraConfig lora;  ///< r, lora_alpha, lora_dropout, target_modules, exclude_modules
  std::vector<std::string> modules_to_save;
  std::string base_model_name_or_path;
  std::string task_type = "CAUSAL_LM";  ///< or "TOKEN_CLS" (a value model)
};

/// The seed the workers draw fresh adapters from: every rank, role and run starts from the same A.
inline constexpr uint64_t kLoraInitSeed = 0;

/// PEFT's file names.
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

/// The adapter and modules_to_save tensors under PEFT's key names
/// (base_model.model.<path>.lora_A.weight, base_model.model.score.weight).
NamedTensors adapter_state(const torch::nn::Module& root, const std::vector<std::string>& modules_to_save = {});

/// Writes `dir`/adapter_config.json and adapter_model.safetensors (created if needed).
void save_adapter(const torch::nn::Module& root, const LoraConfig& config, const std::string& base_model_name_or_path,
                  const std::filesystem::path& dir, const std::vector<std::string>& modules_to_save = {},
                  const std::string& task_type = "CAUSAL_LM");

/// Reads `dir`/adapter_config.json. FormatError naming the file and key when malformed or not
/// peft_type LORA.
AdapterFileConfig read_adapter_config(const std::filesystem::path& dir);

/// Loads an adapter directory into `root`, which must already carry adapters. ValueError naming
/// the mismatch when the file's base model (when `base_model_name_or_path` is non-empty), rank,
/// alpha, adapted modules or modules_to_save differ from the model's; FormatError naming the
/// tensor when one is missing or has another shape.
void load_adapter(torch::nn::Module& root, const std::filesystem::path& dir,
                  const std::string& base_model_name_or_path = "");
/// load_adapter's checks and the file's tensors under the model's parameter names, without
/// writing them (for models whose parameters live elsewhere, e.g. in FSDP shards).
NamedTensors read_adapter(const torch::nn::Module& root, const std::filesystem::path& dir,
                          const std::string& base_model_name_or_path = "");

/// Adds the adapters an adapter directory describes to a plain `root` (apply_lora with its
/// config) and loads them; the same checks as load_adapter. Returns the file's config.
AdapterFileConfig apply_adapter(torch::nn::Module& root, const std::filesystem::path& dir,
                                const std::string& base_model_name_or_path = "");

}  // namespace hyflow::models
