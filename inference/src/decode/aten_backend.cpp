// The decode engine's ATen forward: the model's math in the model's own order of operations
// (llama.cpp: RMSNorm in float32, rotary in the model dtype, scores / sqrt(head_dim), softmax in
// float32), over the rows of a pass and a paged KV pool held as one tensor on the model's device.
#include "aten_backend.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/cuda/linear.hpp>
#include <hyflow/cuda/log_probs.hpp>
#include <hyflow/cuda/sampling.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace hyflow::inference::decode {
namespace {

namespace F = torch::nn::functional;

// The most negative finite value of a dtype, as the model masks scores (llama.cpp).
double mask_value(at::ScalarType dtype) {
  if (dtype == at::kHalf) return -65504.0;
  if (dtype == at::kBFloat16) return -3.38e38;
  return std::numeric_limits<float>::lowest();
}

// A host buffer for one transfer to `device`: pinned when the device is not the CPU, so the
// copy is asynchronous and the pass does not wait for it.
at::Tensor host_buffer(int64_t n, at::ScalarType dtype, const c10::Device& device) {
  return at::empty({n}, at::TensorOptions().dtype(dtype).pinned_memory(!device.is_cpu()));
}

at::Tensor to_device(const at::Tensor& host, const c10::Device& device) {
  return device.is_cpu() ? host : host.to(device, /*non_blocking=*/true);
}

}  // namespace

AtenBackend::AtenBackend(models::CausalLM model, int64_t block_size, int64_t attention_chunk_elements, bool bf16)
    : model_(model), source_(std::move(model)), block_size_(block_size), chunk_elements_(attention_chunk_elements) {
  if (!supports(model_)) {
    throw ValueError(
        "DecodeEngine (ATen backend): the model's parameters must be floating point, contiguous and on "
        "one device");
  }
  float_logits_ = bf16;
  const auto& source_first = source_->model->embed_tokens->weight;
  if (bf16 && source_first.scalar_type() != at::kBFloat16) {
    // A copy of the model's shape in bf16 on its device; refresh_weights() fills it. Its random
    // initialization draws from a generator of its own, not the process's default one.
    auto generator = at::detail::getDefaultCPUGenerator();
    at::Tensor state;
    {
      std::lock_guard lock(generator.mutex());
      state = generator.get_state();
    }
    model_ = models::CausalLM(source_->config());
    {
      std::lock_guard lock(generator.mutex());
      generator.set_state(state);
    }
    model_->to(source_first.device(), at::kBFloat16);
    model_->eval();
    cast_ = true;
  }
  const auto& c = model_->config();
  layers_ = c.num_hidden_layers;
  heads_ = c.num_attention_heads;
  kv_heads_ = c.num_key_value_heads;
  head_dim_ = c.resolved_head_dim();
  eps_ = c.rms_norm_eps;
  const auto& first = model_->model->embed_tokens->weight;
  options_ = at::TensorOptions().dtype(first.scalar_type()).device(first.device());
}

bool AtenBackend::supports(const models::CausalLM& model) {
  const auto params = model->parameters();
  if (params.empty()) return false;
  const auto device = params.front().device();
  const auto dtype = params.front().scalar_type();
  return std::all_of(params.begin(), params.end(), [&](const at::Tensor& p) {
    return p.device() == device && p.scalar_type() == dtype && at::isFloatingType(dtype) && p.is_contiguous();
  });
}

int64_t AtenBackend::refresh_weights() {
  if (!cast_) return 0;
  torch::NoGradGuard no_grad;
  const auto sources = source_->parameters();
  const auto copies = model_->parameters();
  cast_from_.resize(sources.size());
  int64_t cast = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& src = sources[i];
    auto& from = cast_from_[i];
    const bool current = from.source.defined() && from.source.unsafeGetTensorImpl() == src.unsafeGetTensorImpl() &&
                         from.data == src.data_ptr() && !src.is_inference() &&
                         from.version == static_cast<int64_t>(src._version());
    if (current) continue;
    if (copies[i].sizes() != src.sizes()) {
      throw ShapeError("DecodeEngine (ATen backend): parameter " + std::to_string(i) +
                       " changed shape since the engine was made");
    }
    copies[i].copy_(src);
    from = CastSource{src, src.data_ptr(), src.is_inference() ? -1 : static_cast<int64_t>(src._version())};
    ++cast;
  }
  return cast;
}

void AtenBackend::drop_weights() {
  cast_from_.clear();
}

int64_t AtenBackend::cast_bytes() const {
  if (!cast_) return 0;
  int64_t bytes = 0;
  for (const auto& p : model_->parameters()) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}

int64_t AtenBackend::kv_block_bytes() const {
  return layers_ * 2 * block_size_ * kv_heads_ * head_dim_ *
         static_cast<int64_t>(c10::elementSize(options_.dtype().toScalarType()));
}

int64_t AtenBackend::pool_bytes() const {
  return kv_.defined() ? static_cast<int64_t>(kv_.nbytes()) : 0;
}

void AtenBackend::release() {
  kv_ = at::Tensor();
  blocks_ = 0;
  cos_ = sin_ = logits_ = at::Tensor();
}

int64_t AtenBackend::prepare(int64_t blocks, int64_t most, int64_t max_pos) {
  if (!kv_.defined() || blocks > blocks_ || blocks_ > most) {
    kv_ = at::Tensor();  // the old pool goes before the new one is allocated
    // Zeros, not empty: attention gathers whole blocks and masks the positions past a row's
    // context, and 0 * NaN from uninitialized memory would survive the mask.
    kv_ = at::zeros({layers_, 2, blocks * block_size_, kv_heads_, head_dim_}, options_);
    blocks_ = blocks;
  }
  if (!cos_.defined() || cos_.size(0) <= max_pos) {
    const auto& c = model_->config();
    models::RotaryEmbedding rotary(head_dim_, c.rope_theta, c.rope_scaling);
    auto positions = at::arange(max_pos + 1, at::TensorOptions().dtype(at::kLong).device(options_.device()));
    auto [cos, sin] = rotary.cos_sin(positions.unsqueeze(0), options_.dtype().toScalarType());
    cos_ = cos.reshape({max_pos + 1, head_dim_}).contiguous();
    sin_ = sin.reshape({max_pos + 1, head_dim_}).contiguous();
  }
  return blocks_;
}

at::Tensor AtenBackend::rms_norm(const at::Tensor& x, const at::Tensor& weight) const {
  auto h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * h.to(x.scalar_type());
}

// x W^T + b. float32 CPU tensors take the model's own choice (oneDNN unless set_onednn_linear(false):
// Debian's LibTorch multiplies on the reference BLAS); devices and other dtypes take ATen's.
at::Tensor AtenBackend::linear(const at::Tensor& x, const torch::nn::Linear& layer) const {
  const auto bias = layer->options.bias() ? layer->bias : at::Tensor();
  if (models::onednn_linear_enabled() && cuda::onednn_linear_supported(x))
    return cuda::onednn_linear(x, layer->weight, bias);
  return F::linear(x, layer->weight, bias);
}

void AtenBackend::forward(const std::vector<AtenRow>& rows) {
  const auto R = static_cast<int64_t>(rows.size());
  const int64_t D = head_dim_, G = heads_ / kv_heads_, bs = block_size_;
  int64_t context = 1, n_logits = 0;
  for (const auto& r : rows) {
    context = std::max(context, r.index + 1);
    n_logits += r.logits ? 1 : 0;
  }
  const int64_t max_blocks = (context + bs - 1) / bs;

  // ---- one transfer: tokens, positions, cache slots, context lengths, logits rows, block tables ----
  const auto device = options_.device();
  auto meta = host_buffer(4 * R + n_logits + R * max_blocks, at::kLong, device);
  int64_t* m = meta.data_ptr<int64_t>();
  int64_t* logit_rows = m + 4 * R;
  int64_t* tables = logit_rows + n_logits;
  for (int64_t i = 0, j = 0; i < R; ++i) {
    const auto& r = rows[static_cast<size_t>(i)];
    m[i] = r.token;
    m[R + i] = r.position;
    m[2 * R + i] = static_cast<int64_t>(r.blocks[r.index / bs]) * bs + r.index % bs;
    m[3 * R + i] = r.index + 1;
    if (r.logits) logit_rows[j++] = i;
    for (int64_t b = 0; b < max_blocks; ++b) tables[i * max_blocks + b] = b < r.n_blocks ? r.blocks[b] : 0;
  }
  const auto dev = to_device(meta, device);
  const auto tokens = dev.narrow(0, 0, R), positions = dev.narrow(0, R, R), slots = dev.narrow(0, 2 * R, R);
  const auto lengths = dev.narrow(0, 3 * R, R);
  const auto logits_rows = dev.narrow(0, 4 * R, n_logits);
  const auto table = dev.narrow(0, 4 * R + n_logits, R * max_blocks).view({R, max_blocks});

  // Attention reads the context in chunks of whole blocks, each gathering at most chunk_elements_
  // keys (and as many values): one chunk (one gather, one softmax) when the whole context fits.
  const int64_t per_position = R * kv_heads_ * D;
  const int64_t chunk_blocks =
      std::clamp<int64_t>(chunk_elements_ / std::max<int64_t>(1, per_position * bs), 1, max_blocks);
  const int64_t chunks = (max_blocks + chunk_blocks - 1) / chunk_blocks;
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  // Chunk c: the cache slots of its positions (R * positions: block b's are b * bs + 0..bs-1) and
  // (R, 1, 1, positions) true past a row's own context.
  struct Chunk {
    at::Tensor slots, blocked;
    int64_t positions = 0;
  };
  auto chunk_of = [&](int64_t c) {
    const int64_t b0 = c * chunk_blocks, nb = std::min(chunk_blocks, max_blocks - b0);
    const int64_t p0 = b0 * bs, n = std::min(nb * bs, context - p0);
    Chunk out;
    out.positions = n;
    out.slots = (table.narrow(1, b0, nb).unsqueeze(-1) * bs + at::arange(bs, long_options))
                    .view({R, nb * bs})
                    .narrow(1, 0, n)
                    .reshape({-1});
    out.blocked = at::arange(p0, p0 + n, long_options).unsqueeze(0).ge(lengths.unsqueeze(1)).view({R, 1, 1, n});
    return out;
  };
  const Chunk whole = chunks == 1 ? chunk_of(0) : Chunk{};  // made once per pass, used by every layer
  peak_gather_ = std::max(peak_gather_, per_position * std::min(context, chunk_blocks * bs));
  const auto cos = cos_.index_select(0, positions).unsqueeze(1);  // (R, 1, D)
  const auto sin = sin_.index_select(0, positions).unsqueeze(1);
  auto rotate = [&](const at::Tensor& x) {  // (R, heads, D), the model's apply_rotary
    const int64_t half = D / 2;
    auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
    return x * cos + rotated * sin;
  };

  auto& m_ = *model_->model;
  auto x = m_.embed_tokens->weight.index_select(0, tokens);  // (R, d)
  const double scale = std::sqrt(static_cast<double>(D));
  const double masked = mask_value(options_.dtype().toScalarType());
  for (int64_t l = 0; l < layers_; ++l) {
    auto* layer = m_.layers[static_cast<size_t>(l)]->as<models::DecoderLayerImpl>();
    auto& a = *layer->self_attn;
    auto h = rms_norm(x, layer->input_layernorm->weight);
    auto q = rotate(linear(h, a.q_proj).view({R, heads_, D}));
    auto k = rotate(linear(h, a.k_proj).view({R, kv_heads_, D}));
    auto v = linear(h, a.v_proj).view({R, kv_heads_, D});
    auto keys = kv_.select(0, l).select(0, 0);  // (slots, kv_heads, D)
    auto values = kv_.select(0, l).select(0, 1);
    keys.index_copy_(0, slots, k);
    values.index_copy_(0, slots, v);
    // query head h reads kv head h / G: (R, H, D) -> (R, kv_heads, G, D)
    const auto qg = q.view({R, kv_heads_, G, D});
    // A chunk's keys and values, (R, positions, kv_heads, D) -> (R, kv_heads, positions, D), and
    // its masked scores (R, kv_heads, G, positions).
    auto attend_chunk = [&](const Chunk& c, at::Tensor& V) {
      auto K = keys.index_select(0, c.slots).view({R, c.positions, kv_heads_, D}).permute({0, 2, 1, 3});
      V = values.index_select(0, c.slots).view({R, c.positions, kv_heads_, D}).permute({0, 2, 1, 3});
      return (at::matmul(qg, K.transpose(2, 3)) / scale).masked_fill(c.blocked, masked);
    };
    at::Tensor att;
    if (chunks == 1) {
      at::Tensor V;
      auto scores = attend_chunk(whole, V);
      auto probs = at::softmax(scores, -1, at::kFloat).to(V.scalar_type());
      att = at::matmul(probs, V).reshape({R, heads_ * D});
    } else {
      // Online softmax in float32 (FlashAttention's): running max m, denominator l and
      // unnormalized sum acc of the chunks so far, rescaled by exp(m_old - m_new) per chunk. Every
      // row has position 0 in the first chunk, so m is finite from there on and a chunk wholly
      // past a row's context adds exp(masked - m) = 0.
      at::Tensor m, l, acc;
      for (int64_t c = 0; c < chunks; ++c) {
        at::Tensor V;
        const auto scores = attend_chunk(chunk_of(c), V).to(at::kFloat);
        const auto m_new = c == 0 ? scores.amax(-1, /*keepdim=*/true) : at::maximum(m, scores.amax(-1, true));
        const auto p = at::exp(scores - m_new);
        const auto pv = at::matmul(p.to(V.scalar_type()), V).to(at::kFloat);  // (R, kv_heads, G, D)
        if (c == 0) {
          l = p.sum(-1, /*keepdim=*/true);
          acc = pv;
        } else {
          const auto alpha = at::exp(m - m_new);
          l = l * alpha + p.sum(-1, true);
          acc = acc * alpha + pv;
        }
        m = m_new;
      }
      att = (acc / l).to(options_.dtype().toScalarType()).reshape({R, heads_ * D});
    }
    x = x + linear(att, a.o_proj);
    auto& f = *layer->mlp;
    auto h2 = rms_norm(x, layer->post_attention_layernorm->weight);
    x = x + linear(F::silu(linear(h2, f.gate_proj)) * linear(h2, f.up_proj), f.down_proj);
  }
  auto last = rms_norm(x.index_select(0, logits_rows), m_.norm->weight);
  const auto& head = model_->lm_head ? model_->lm_head->weight : m_.embed_tokens->weight;
  logits_ = models::onednn_linear_enabled() && cuda::onednn_linear_supported(last) ? cuda::onednn_linear(last, head)
                                                                           : F::linear(last, head);
  if (float_logits_) logits_ = logits_.to(at::kFloat);  // bf16 engine: sampling and log-probs in float32
}

void AtenBackend::choose(const std::vector<AtenPick>& picks, const DecodeSampling& sampling,
                         std::vector<int64_t>& tokens, std::vector<float>& log_probs) {
  const auto P = static_cast<int64_t>(picks.size());
  tokens.assign(picks.size(), 0);
  log_probs.assign(picks.size(), 0.0F);
  if (P == 0) return;
  // One sample_seeded call for every pick, each with its own step (continuous batching mixes
  // steps); invalid rows come back as -1 with the tokens, checked below, so nothing here reads
  // the device.
  const auto device = options_.device();
  auto meta = host_buffer(3 * P, at::kLong, device);
  int64_t* m = meta.data_ptr<int64_t>();
  for (int64_t i = 0; i < P; ++i) {
    const auto& pick = picks[static_cast<size_t>(i)];
    m[i] = pick.logits_row;
    m[P + i] = pick.row_id;
    m[2 * P + i] = pick.step;
  }
  const auto dev = to_device(meta, device);
  const auto z = logits_.index_select(0, dev.narrow(0, 0, P));  // (P, vocab)

  const bool greedy = sampling.sampling.is_greedy();
  const at::Tensor chosen =
      greedy ? z.argmax(-1)  // first maximum: the lowest id on ties
             : cuda::sample_seeded_unchecked(z, sampling.sampling, sampling.seed, 0, dev.narrow(0, P, P),
                                             cuda::RowSampling{.step = dev.narrow(0, 2 * P, P)});
  // The stop check's one read: tokens and log-probs in one double tensor (ids < 2^53 are exact).
  at::Tensor back = chosen.to(at::kDouble);
  if (sampling.return_log_probs) {
    const double temperature = greedy ? 1.0 : sampling.sampling.temperature;
    // an invalid row's -1 is clamped here and refused below
    auto lp = cuda::log_probs_and_entropy(z, chosen.clamp_min(0), {.temperature = temperature, .with_entropy = false})
                  .log_probs;
    back = at::cat({back, lp.to(at::kDouble)});
  }
  back = back.to(at::kCPU);
  const double* host = back.data_ptr<double>();
  for (int64_t i = 0; i < P; ++i) {
    const auto pick = static_cast<size_t>(i);
    tokens[pick] = static_cast<int64_t>(host[i]);
    if (tokens[pick] < 0) {
      throw ValueError("decode engine: sample row " + std::to_string(picks[pick].row_id) +
                       " has a NaN logit or no finite logit at step " + std::to_string(picks[pick].step));
    }
    if (sampling.return_log_probs) log_probs[pick] = static_cast<float>(host[P + i]);
  }
}

void AtenBackend::copy_positions(int32_t from, int32_t to, int64_t count) {
  // kv_: (layers, 2, slots, kv_heads, D): every layer's keys and values in one copy
  kv_.narrow(2, static_cast<int64_t>(to) * block_size_, count)
      .copy_(kv_.narrow(2, static_cast<int64_t>(from) * block_size_, count));
}

}  // namespace hyflow::inference::decode
