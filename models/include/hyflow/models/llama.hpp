#pragma once
// Decoder-only transformer of the Llama / Qwen2 family: RMSNorm, rotary embeddings,
// grouped-query attention, SwiGLU MLP, optional QKV bias, tied or untied embeddings.
// Parameter names are Hugging Face's, so state dicts map one to one onto safetensors.

#include <hyflow/models/config.hpp>
#include <hyflow/models/inference_context.hpp>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace hyflow::models {

/// x * rsqrt(mean(x^2) + eps) * weight, computed in float32 (as Hugging Face does).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

/// cos/sin tables for rotary embeddings from position ids; rope_theta and linear scaling.
class RotaryEmbedding {
 public:
  RotaryEmbedding(int64_t head_dim, double theta, RopeScaling scaling);
  /// position_ids (B, T) -> cos, sin (B, 1, T, D) in `dtype`.
  std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor& position_ids, at::ScalarType dtype) const;

 private:
  at::Tensor inv_freq_;  // (D/2,) float32
  RopeScaling scaling_;
};

/// Rotates x (B, H, T, D) by the angles in cos/sin (B, 1, T, D): x cos + rotate_half(x) sin.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// Grouped-query self-attention. `blocked` (B, 1, T, S) is true where a query may not look.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& blocked,
                     InferenceContext* context, int64_t layer);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

/// down(silu(gate(x)) * up(x)).
class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x, InferenceContext* context = nullptr);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(MLP);

/// Pre-norm block: h = x + attn(norm(x)); h + mlp(norm(h)).
class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& blocked,
                     InferenceContext* context, int64_t layer);
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

/// Embeddings, decoder layers and the final norm (Hugging Face's `model.` prefix).
class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const ModelConfig& config);
  /// input_ids (B, T) -> final hidden states (B, T, d).
  /// attention_mask (B, S) marks real tokens (1) and padding (0) over S = cached + T
  /// positions; undefined means all ones. position_ids (B, T): undefined means
  /// clip(cumsum(mask) - 1, 0) (verl's rule, dataproto::position_ids_from_mask), taken at the
  /// last T positions. With a context, the new positions' keys and values go to its KV cache
  /// and attend to the cached ones.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                     const at::Tensor& position_ids = {}, InferenceContext* context = nullptr);
  /// Recompute each layer in backward instead of keeping its activations.
  void set_gradient_checkpointing(bool on) { gradient_checkpointing_ = on; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};

 private:
  ModelConfig config_;
  RotaryEmbedding rotary_;
  bool gradient_checkpointing_ = false;
};
TORCH_MODULE(Transformer);

/// Language model: logits over the vocabulary for every position.
class CausalLMImpl : public torch::nn::Module {
 public:
  /// Weights drawn from N(0, initializer_range) with the current torch seed, biases 0.
  explicit CausalLMImpl(ModelConfig config);
  /// (B, T) -> logits (B, T, V); arguments as in TransformerImpl::forward.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                     const at::Tensor& position_ids = {}, InferenceContext* context = nullptr);
  /// Hidden states (B, T, d) -> logits (B, T, V) (tied embeddings use embed_tokens).
  /// With a context, inference mode uses its packed weights (see set_onednn_linear).
  at::Tensor logits(const at::Tensor& hidden, InferenceContext* context = nullptr) const;
  const ModelConfig& config() const { return config_; }

  Transformer model{nullptr};
  torch::nn::Linear lm_head{nullptr};  ///< null when tie_word_embeddings

 private:
  ModelConfig config_;
};
TORCH_MODULE(CausalLM);

/// Critic / reward model: the transformer plus a scalar head per token (Hugging Face's
/// *ForTokenClassification with num_labels = 1: parameters `score.weight`, `score.bias`).
class ValueModelImpl : public torch::nn::Module {
 public:
  explicit ValueModelImpl(ModelConfig config);
  /// (B, T) -> values (B, T) in float32.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                     const at::Tensor& position_ids = {});
  const ModelConfig& config() const { return config_; }

  Transformer model{nullptr};
  torch::nn::Linear score{nullptr};

 private:
  ModelConfig config_;
};
TORCH_MODULE(ValueModel);

/// Linear layers in float32 on CPU run on oneDNN's inner product (cuda::onednn_linear,
/// forward and backward; generation packs each weight once in its InferenceContext) when
/// LibTorch has oneDNN. Debian's LibTorch 1.13 runs float32 GEMM on the reference BLAS,
/// 4-20x slower at these shapes. On by default; off gives plain nn::Linear
/// (torch::nn::functional::linear). Process-wide switch.
void set_onednn_linear(bool enabled);
bool onednn_linear_enabled();

}  // namespace hyflow::models
