// The Llama / Qwen2 decoder, top to bottom: norm, rotary, attention, MLP, layer, stack, heads.
#include <hyflow/models/llama.hpp>
#include <hyflow/models/lora.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/cuda/linear.hpp>
#include <hyflow/dataproto/position_ids.hpp>

#include <torch/torch.h>

#include <atomic>
#include <limits>

namespace hyflow::models {
namespace F = torch::nn::functional;

// ---- RMSNorm ---------------------------------------------------------------------------
RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  auto h = x.to(at::kFloat);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * h.to(x.scalar_type());
}

// ---- rotary embeddings -----------------------------------------------------------------
RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta, RopeScaling scaling) : scaling_(std::move(scaling)) {
  auto exponents = torch::arange(0, head_dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(head_dim);
  inv_freq_ = 1.0 / torch::pow(theta, exponents);  // (D/2,)
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::cos_sin(const at::Tensor& position_ids, at::ScalarType dtype) const {
  auto pos = position_ids.to(at::kFloat);
  if (scaling_.type == "linear") pos = pos / scaling_.factor;
  auto freqs = pos.unsqueeze(-1) * inv_freq_.to(pos.device());  // (B, T, D/2)
  auto angles = torch::cat({freqs, freqs}, -1).unsqueeze(1);    // (B, 1, T, D)
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

// ---- attention -------------------------------------------------------------------------
namespace {

// The most negative finite value of a dtype: masked scores stay finite, so rows with every
// key masked (left-padding queries) give a uniform distribution instead of NaN.
double mask_value(at::ScalarType dtype) {
  if (dtype == at::kHalf) return -65504.0;
  if (dtype == at::kBFloat16) return -3.38e38;
  return std::numeric_limits<float>::lowest();
}

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

std::atomic<bool> g_onednn_linear{true};

bool use_onednn(const at::Tensor& x) {
  return g_onednn_linear.load(std::memory_order_relaxed) && cuda::onednn_linear_supported(x);
}

// x (..., in) @ weight (out, in)^T + bias -> (..., out). On CPU float32 the product runs on
// oneDNN (see set_onednn_linear); inference with a context reuses the context's packed weights.
at::Tensor linear_forward(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& x,
                          InferenceContext* context) {
  if (!use_onednn(x)) return F::linear(x, weight, bias);
  if (context != nullptr && c10::InferenceMode::is_enabled()) {
    return cuda::onednn_linear_packed(x, context->packed_weight(weight), bias);
  }
  return cuda::onednn_linear(x, weight, bias);
}

at::Tensor project(const torch::nn::Linear& layer, const at::Tensor& x, InferenceContext* context) {
  return add_lora(*layer, x, linear_forward(layer->weight, layer->bias, x, context));
}

}  // namespace

void set_onednn_linear(bool enabled) {
  g_onednn_linear.store(enabled);
}
bool onednn_linear_enabled() {
  return g_onednn_linear.load();
}

AttentionImpl::AttentionImpl(const ModelConfig& c)
    : num_heads_(c.num_attention_heads), num_kv_heads_(c.num_key_value_heads), head_dim_(c.resolved_head_dim()) {
  q_proj = register_module("q_proj", linear(c.hidden_size, num_heads_ * head_dim_, c.qkv_bias));
  k_proj = register_module("k_proj", linear(c.hidden_size, num_kv_heads_ * head_dim_, c.qkv_bias));
  v_proj = register_module("v_proj", linear(c.hidden_size, num_kv_heads_ * head_dim_, c.qkv_bias));
  o_proj = register_module("o_proj", linear(num_heads_ * head_dim_, c.hidden_size, c.o_bias));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const at::Tensor& blocked, InferenceContext* context, int64_t layer) {
  const int64_t B = x.size(0), T = x.size(1), G = num_heads_ / num_kv_heads_;
  // (B, T, H*D) -> (B, T, H, D) -> (B, H, T, D)
  auto q = project(q_proj, x, context).view({B, T, num_heads_, head_dim_}).transpose(1, 2);
  auto k = project(k_proj, x, context).view({B, T, num_kv_heads_, head_dim_}).transpose(1, 2);
  auto v = project(v_proj, x, context).view({B, T, num_kv_heads_, head_dim_}).transpose(1, 2);
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  if (context != nullptr) std::tie(k, v) = context->kv_cache().append(layer, k, v);  // (B, H_kv, S, D)
  const int64_t S = k.size(2);

  // Query head h reads kv head h / G: group the G query heads of a kv head along the rows.
  // (B, H, T, D) -> (B, H_kv, G*T, D)
  auto grouped_q = q.reshape({B, num_kv_heads_, G * T, head_dim_});
  auto scores = torch::matmul(grouped_q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(head_dim_));
  scores = scores.view({B, num_heads_, T, S}).masked_fill(blocked, mask_value(scores.scalar_type()));
  auto probs = torch::softmax(scores, -1, at::kFloat).to(v.scalar_type());  // (B, H, T, S)
  auto out = torch::matmul(probs.view({B, num_kv_heads_, G * T, S}), v);    // (B, H_kv, G*T, D)
  // (B, H, T, D) -> (B, T, H*D)
  out = out.view({B, num_heads_, T, head_dim_}).transpose(1, 2).reshape({B, T, num_heads_ * head_dim_});
  return project(o_proj, out, context);
}

// ---- MLP -------------------------------------------------------------------------------
MLPImpl::MLPImpl(const ModelConfig& c) {
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size, c.mlp_bias));
}

at::Tensor MLPImpl::forward(const at::Tensor& x, InferenceContext* context) {
  return project(down_proj, F::silu(project(gate_proj, x, context)) * project(up_proj, x, context), context);
}

// ---- decoder layer ---------------------------------------------------------------------
DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c) {
  self_attn = register_module("self_attn", Attention(c));
  mlp = register_module("mlp", MLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     const at::Tensor& blocked, InferenceContext* context, int64_t layer) {
  auto h = x + self_attn(input_layernorm(x), cos, sin, blocked, context, layer);
  return h + mlp(post_attention_layernorm(h), context);
}

namespace {

// Gradient checkpointing as an autograd function (LibTorch has no torch.utils.checkpoint):
// forward runs the layer without recording a graph; backward recomputes it with grad on and
// back-propagates through the recomputed graph, which accumulates the parameter gradients
// (the reentrant scheme). The layers have no dropout, so recomputation is exact.
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x, at::Tensor cos,
                                                at::Tensor sin, at::Tensor blocked, DecoderLayerImpl* layer) {
    // IValue holds no raw pointers; the layer outlives the graph that refers to it.
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    ctx->save_for_backward({x, cos, sin, blocked});
    return {layer->forward(x, cos, sin, blocked, nullptr, 0)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    auto x = saved[0].detach().requires_grad_(true);
    at::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = layer->forward(x, saved[1], saved[2], saved[3], nullptr, 0);
    }
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), {}, {}, {}, {}};
  }
};

}  // namespace

// ---- transformer stack -----------------------------------------------------------------
TransformerImpl::TransformerImpl(const ModelConfig& config)
    : config_(config), rotary_(config.resolved_head_dim(), config.rope_theta, config.rope_scaling) {
  config_.validate();
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(DecoderLayer(config));
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor TransformerImpl::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                    const at::Tensor& position_ids, InferenceContext* context) {
  if (input_ids.dim() != 2) {
    throw ShapeError("Transformer: input_ids must be (B, T), got " + std::to_string(input_ids.dim()) + "-D");
  }
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  const int64_t past = context ? context->kv_cache().length() : 0, S = past + T;
  auto mask = attention_mask.defined() ? attention_mask.to(at::kBool)
                                       : torch::ones({B, S}, input_ids.options().dtype(at::kBool));
  if (mask.dim() != 2 || mask.size(0) != B || mask.size(1) != S) {
    throw ShapeError("Transformer: attention_mask must be (B, cached + T) = (" + std::to_string(B) + ", " +
                     std::to_string(S) + "), got " + std::to_string(mask.size(0)) + "x" +
                     std::to_string(mask.dim() > 1 ? mask.size(1) : 0));
  }
  auto positions = position_ids.defined() ? position_ids : position_ids_from_mask(mask).narrow(1, past, T);
  if (positions.sizes() != input_ids.sizes()) {
    throw ShapeError("Transformer: position_ids must have the shape of input_ids");
  }

  // blocked[b, 0, t, s]: key s is padding, or lies after query t (which sits at past + t).
  auto query_pos = torch::arange(past, S, input_ids.options().dtype(at::kLong)).view({T, 1});
  auto key_pos = torch::arange(0, S, input_ids.options().dtype(at::kLong)).view({1, S});
  auto future = (key_pos > query_pos).view({1, 1, T, S});
  auto blocked = future.logical_or(mask.logical_not().view({B, 1, 1, S}));  // (B, 1, T, S)

  auto h = embed_tokens(input_ids);  // (B, T, d)
  auto [cos, sin] = rotary_.cos_sin(positions, h.scalar_type());
  // A frozen embedding (LoRA) gives the layers an input without gradient while their adapters
  // need one: the checkpointed layers' backward runs only from a differentiable input (PEFT's
  // enable_input_require_grads).
  if (gradient_checkpointing_ && context == nullptr && torch::GradMode::is_enabled() && !h.requires_grad())
    h = h.detach().requires_grad_(true);
  const bool checkpoint =
      gradient_checkpointing_ && context == nullptr && torch::GradMode::is_enabled() && h.requires_grad();
  for (int64_t i = 0; i < static_cast<int64_t>(layers->size()); ++i) {
    auto* layer = layers[i]->as<DecoderLayerImpl>();
    h = checkpoint ? CheckpointedLayer::apply(h, cos, sin, blocked, layer)[0]
                   : layer->forward(h, cos, sin, blocked, context, i);
  }
  if (context != nullptr) context->kv_cache().advance(T);
  return norm(h);
}

// ---- heads -----------------------------------------------------------------------------
namespace {

void init_weights(torch::nn::Module& module, double std) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    const auto& name = item.key();
    auto& p = item.value();
    if (name.ends_with("norm.weight")) continue;  // RMSNorm weights start at one
    if (name.ends_with(".bias")) {
      p.zero_();
    } else {
      p.normal_(0.0, std);
    }
  }
}

}  // namespace

CausalLMImpl::CausalLMImpl(ModelConfig config) : config_(std::move(config)) {
  model = register_module("model", Transformer(config_));
  if (!config_.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear(config_.hidden_size, config_.vocab_size, false));
  }
  init_weights(*this, config_.initializer_range);
}

at::Tensor CausalLMImpl::logits(const at::Tensor& hidden, InferenceContext* context) const {
  if (lm_head) return linear_forward(lm_head->weight, {}, hidden, context);
  return linear_forward(model->embed_tokens->weight, {}, hidden, context);
}

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                 const at::Tensor& position_ids, InferenceContext* context) {
  return logits(model(input_ids, attention_mask, position_ids, context), context);
}

ValueModelImpl::ValueModelImpl(ModelConfig config) : config_(std::move(config)) {
  model = register_module("model", Transformer(config_));
  score = register_module("score", linear(config_.hidden_size, 1, true));
  init_weights(*this, config_.initializer_range);
}

at::Tensor ValueModelImpl::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                   const at::Tensor& position_ids) {
  return score(model(input_ids, attention_mask, position_ids)).squeeze(-1).to(at::kFloat);  // (B, T)
}

}  // namespace hyflow::models
