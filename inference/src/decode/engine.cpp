// The decode engine: a generation-only forward of the Llama / Qwen2 decoder on raw float32
// pointers into the model's parameters, driven by a continuous-batching scheduler over a paged
// KV cache. Every forward pass takes "rows": one token of one sequence each, with the cache
// index it is written at and its rotary position. A decode step is one row per running
// sequence, a prefill is one row per prompt token, and both mix in one pass, so each weight is
// read once per step for everything in flight.
#include <hyflow/inference/decode_engine.hpp>

#include "aten_backend.hpp"
#include "kernels.hpp"

#include <hyflow/core/error.hpp>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>

namespace hyflow::inference {
namespace {

const float* ptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

// The float32 data of a parameter the kernels read as float32 (embedding, norms, biases): its own for a
// float32 model, a widened copy for a bf16 one.
using FloatOf = std::function<const float*(const at::Tensor&)>;

struct LayerWeights {
  const float *input_norm, *post_norm;
  // w*: packed (decode::pack_weight: float; decode::pack_weight_bf16: uint32_t pairs of bf16)
  const void* wq;
  const float* bq;
  const void* wk;
  const float* bk;
  const void* wv;
  const float* bv;
  const void* wo;
  const float* bo;
  const void* wg;
  const float* bg;
  const void* wu;
  const float* bu;
  const void* wd;
  const float* bd;
};

struct Weights {
  const float* embed = nullptr;
  const void* head = nullptr;  // packed
  const float* final_norm = nullptr;
  std::vector<LayerWeights> layers;
};

// The linear weights of the model in a fixed order: per layer q, k, v, o, gate, up, down; then
// the head (the embedding when tied).
std::vector<at::Tensor> linear_weights(models::CausalLM& model) {
  std::vector<at::Tensor> out;
  auto& m = *model->model;
  for (const auto& item : *m.layers) {
    auto* layer = item->as<models::DecoderLayerImpl>();
    auto& a = *layer->self_attn;
    auto& f = *layer->mlp;
    for (auto* lin : {&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &f.gate_proj, &f.up_proj, &f.down_proj}) {
      out.push_back((*lin)->weight);
    }
  }
  out.push_back(model->lm_head ? model->lm_head->weight : m.embed_tokens->weight);
  return out;
}

// packed[i]: the packed copy of linear_weights(model)[i]; float_of: the float32 data of the other
// parameters, asked for in the same order on every call.
Weights weights_of(models::CausalLM& model, const std::vector<const void*>& packed, const FloatOf& float_of) {
  Weights w;
  auto& m = *model->model;
  auto bias_ptr = [&](const torch::nn::Linear& layer) {
    return layer->options.bias() ? float_of(layer->bias) : nullptr;
  };
  w.embed = float_of(m.embed_tokens->weight);
  w.head = packed.back();
  w.final_norm = float_of(m.norm->weight);
  size_t i = 0;
  for (const auto& item : *m.layers) {
    auto* layer = item->as<models::DecoderLayerImpl>();
    auto& a = *layer->self_attn;
    auto& f = *layer->mlp;
    const void* const* p = packed.data() + i;
    i += 7;
    w.layers.push_back(LayerWeights{float_of(layer->input_layernorm->weight),
                                    float_of(layer->post_attention_layernorm->weight),
                                    p[0], bias_ptr(a.q_proj), p[1], bias_ptr(a.k_proj), p[2], bias_ptr(a.v_proj), p[3],
                                    bias_ptr(a.o_proj), p[4], bias_ptr(f.gate_proj), p[5], bias_ptr(f.up_proj), p[6],
                                    bias_ptr(f.down_proj)});
  }
  return w;
}

// The packed copy of one weight and what it was made from. The copy is current while the
// parameter is the same tensor (held here, so its address cannot be reused by another), at the
// same data pointer and shape, with the same version counter (every ATen in-place op bumps it:
// optimizer steps, copy_, load_state_dict). Inference tensors have no version counter: they are
// repacked on every run.
struct PackedWeight {
  at::Tensor source;
  const void* data = nullptr;
  int64_t version = -1;
  std::vector<int64_t> shape;
  at::Tensor packed;

  bool current(const at::Tensor& w) const {
    return source.defined() && source.unsafeGetTensorImpl() == w.unsafeGetTensorImpl() && data == w.data_ptr() &&
           !w.is_inference() && version == static_cast<int64_t>(w._version()) && shape == w.sizes().vec();
  }
  // Records w as the source of the copy just made.
  void made_from(const at::Tensor& w) {
    source = w;
    data = w.data_ptr();
    version = w.is_inference() ? -1 : static_cast<int64_t>(w._version());
    shape = w.sizes().vec();
  }
};

// Whether every parameter is bf16 (a model the kernels run in bf16 whatever DecodeEngineOptions::dtype).
bool bf16_model(const models::CausalLM& model) {
  for (const auto& p : model->parameters()) {
    if (p.scalar_type() != at::kBFloat16) return false;
  }
  return true;
}

// Reference-counted KV blocks: a prompt's full blocks are shared by its samples.
class BlockPool {
 public:
  void reset(int64_t blocks) {
    refs_.assign(static_cast<size_t>(blocks), 0);
    free_.clear();
    for (int64_t b = blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
    in_use_ = peak_ = 0;
  }
  int32_t allocate() {
    if (free_.empty())
      throw Error("DecodeEngine: the KV block pool is exhausted (" + std::to_string(refs_.size()) +
                  " blocks); this is a scheduling bug");
    const int32_t b = free_.back();
    free_.pop_back();
    refs_[static_cast<size_t>(b)] = 1;
    peak_ = std::max(peak_, ++in_use_);
    return b;
  }
  void retain(int32_t b) { ++refs_[static_cast<size_t>(b)]; }
  void release(int32_t b) {
    if (--refs_[static_cast<size_t>(b)] == 0) {
      free_.push_back(b);
      --in_use_;
    }
  }
  int64_t peak() const { return peak_; }

 private:
  std::vector<int32_t> refs_, free_;
  int64_t in_use_ = 0, peak_ = 0;
};

struct Sequence {
  std::vector<int32_t> blocks;
  int64_t length = 0;    // cached positions
  int64_t next_pos = 0;  // rotary position of the next token
  int64_t request = 0;
  int64_t sample = 0;  // -1: a shared prompt prefill, forked into the n samples after its pass
  int64_t row_id = 0;
  int64_t token = 0;  // the token the next step feeds
};

// One row of a forward pass.
struct Row {
  int64_t token, seq, index, position;
  bool logits;
};

template <class F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct DecodeEngine::State {
  // Model shape.
  int64_t d = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0, vocab = 0;
  float eps = 0.0F;
  int64_t qdim() const { return heads * head_dim; }
  int64_t kvdim() const { return kv_heads * head_dim; }

  // Paged KV cache: per layer, keys then values, each (blocks, kv_heads, block_size, head_dim):
  // a head's positions in a block are contiguous, so attention reads each head as short streams.
  at::Tensor kv;
  int64_t kv_blocks = 0;
  BlockPool pool;

  // Rotary tables (positions, head_dim), computed by the model's own RotaryEmbedding.
  at::Tensor cos, sin;

  // Packed weights, in linear_weights order, refreshed at the start of every run: float32, or bf16
  // pairs (DecodeDtype::kBFloat16 on the CPU kernels).
  std::vector<PackedWeight> packed;
  bool bf16 = false;
  // A bf16 model (kernels only): its embedding, norms and biases widened to float32 (weights_of's
  // order), made again when one changes (PackedWeight's rule); its linear weights pack as bf16 exactly.
  bool model_bf16 = false;
  std::vector<PackedWeight> widened;

  // Scratch, grown when a pass has more rows than any before (never per step afterwards).
  std::vector<float> x, xn, q, k, v, att, gate, up, logits, rotate_tmp;
  std::vector<const int32_t*> tables;  // per row of a pass: its sequence's block table
  std::vector<int64_t> lengths;        // per row: the positions it attends to
  std::vector<int64_t> logit_rows;     // the rows of a pass that need logits, in order
  int64_t row_capacity = 0, logit_capacity = 0;

  // The pool's elements: float32, or bf16 (uint16_t) when the engine runs in bf16.
  int64_t kv_element_bytes() const { return bf16 ? 2 : 4; }
  // Layer `layer`'s keys (which 0) or values (1), as bytes.
  char* layer_kv(int64_t layer, int which) {
    const int64_t elements = (2 * layer + which) * kv_blocks * block_size * kvdim();
    return static_cast<char*>(kv.data_ptr()) + elements * kv_element_bytes();
  }
  int64_t block_size = 16;

  // The ATen forward (DecodeBackend::kAten); null when the CPU kernels run.
  std::unique_ptr<decode::AtenBackend> aten;
};

DecodeEngine::DecodeEngine(models::CausalLM& model, DecodeEngineOptions options)
    : model_(model), options_(options), state_(std::make_unique<State>()) {
  if (options_.block_size <= 0) {
    throw ValueError("DecodeEngine: block_size must be > 0, got " + std::to_string(options_.block_size));
  }
  if (options_.max_batch < 0) {
    throw ValueError("DecodeEngine: max_batch must be >= 0, got " + std::to_string(options_.max_batch));
  }
  if (options_.attention_chunk_elements <= 0) {
    throw ValueError("DecodeEngine: attention_chunk_elements must be > 0, got " +
                     std::to_string(options_.attention_chunk_elements));
  }
  if (options_.kv_cache_bytes < 0) {
    throw ValueError("DecodeEngine: kv_cache_bytes must be >= 0, got " + std::to_string(options_.kv_cache_bytes));
  }
  if (!(options_.gpu_memory_utilization >= 0.0 && options_.gpu_memory_utilization <= 1.0)) {
    throw ValueError("DecodeEngine: gpu_memory_utilization must be in [0, 1], got " +
                     std::to_string(options_.gpu_memory_utilization));
  }
  if (options_.backend == DecodeBackend::kKernels && !kernels_support(model)) {
    throw ValueError("DecodeEngine: the CPU kernels need float32 or bf16 contiguous CPU parameters (of one dtype)");
  }
  if (!supports(model)) {
    throw ValueError(
        "DecodeEngine: the model must have floating-point contiguous parameters of one dtype on one "
        "device");
  }
  const auto& c = model->config();
  auto& s = *state_;
  if (options_.backend == DecodeBackend::kAten ||
      (options_.backend == DecodeBackend::kAuto && !kernels_support(model))) {
    s.aten = std::make_unique<decode::AtenBackend>(model, options_.block_size, options_.attention_chunk_elements,
                                                   options_.dtype == DecodeDtype::kBFloat16);
  }
  s.model_bf16 = !s.aten && bf16_model(model);
  s.bf16 = !s.aten && (options_.dtype == DecodeDtype::kBFloat16 || s.model_bf16);
  s.d = c.hidden_size;
  s.layers = c.num_hidden_layers;
  s.heads = c.num_attention_heads;
  s.kv_heads = c.num_key_value_heads;
  s.head_dim = c.resolved_head_dim();
  s.inter = c.intermediate_size;
  s.vocab = c.vocab_size;
  s.eps = static_cast<float>(c.rms_norm_eps);
  s.block_size = options_.block_size;
}

DecodeEngine::~DecodeEngine() = default;

void DecodeEngine::drop_packed_weights() {
  state_->packed.clear();
  state_->widened.clear();
  if (state_->aten) state_->aten->drop_weights();
}

void DecodeEngine::free_cache() {
  auto& s = *state_;
  s.kv = at::Tensor();
  s.kv_blocks = 0;
  s.pool.reset(0);
  s.cos = s.sin = at::Tensor();
  for (auto* buf : {&s.x, &s.xn, &s.q, &s.k, &s.v, &s.att, &s.gate, &s.up, &s.logits, &s.rotate_tmp}) {
    std::vector<float>().swap(*buf);
  }
  s.row_capacity = s.logit_capacity = 0;
  if (s.aten) s.aten->release();
}

int64_t DecodeEngine::kv_pool_bytes() const {
  const auto& s = *state_;
  if (s.aten) return s.aten->pool_bytes();
  return s.kv.defined() ? static_cast<int64_t>(s.kv.nbytes()) : 0;
}

int64_t DecodeEngine::packed_bytes() const {
  int64_t bytes = 0;
  for (const auto* copies : {&state_->packed, &state_->widened}) {
    for (const auto& p : *copies) bytes += p.packed.defined() ? p.packed.nbytes() : 0;
  }
  return bytes + (state_->aten ? state_->aten->cast_bytes() : 0);
}
DecodeEngine::DecodeEngine(DecodeEngine&&) noexcept = default;
DecodeEngine& DecodeEngine::operator=(DecodeEngine&&) noexcept = default;

bool DecodeEngine::supports(const models::CausalLM& model) {
  return decode::AtenBackend::supports(model);
}

DecodeBackend DecodeEngine::backend() const {
  return state_->aten ? DecodeBackend::kAten : DecodeBackend::kKernels;
}

bool DecodeEngine::kernels_support(const models::CausalLM& model) {
  const auto params = model->parameters();
  for (const auto& p : params) {
    const auto dtype = p.scalar_type();
    if (!p.device().is_cpu() || !p.is_contiguous() || dtype != params.front().scalar_type()) return false;
    if (dtype != at::kFloat && dtype != at::kBFloat16) return false;
  }
  return true;
}

namespace {

// x cos + rotate_half(x) sin for one head, in place: element i < half and its partner i + half are
// read before either is written. An odd dim (no rotary model has one) goes through tmp (dim floats).
void rotate(float* x, const float* cos, const float* sin, int64_t dim, float* tmp) {
  const int64_t half = dim / 2;
  if (dim % 2 == 0) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * cos[i] + (-b) * sin[i];
      x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
    return;
  }
  std::memcpy(tmp, x, static_cast<size_t>(dim) * sizeof(float));
  for (int64_t i = 0; i < half; ++i) x[i] = tmp[i] * cos[i] + (-tmp[i + half]) * sin[i];
  for (int64_t i = half; i < dim; ++i) x[i] = tmp[i] * cos[i] + tmp[i - half] * sin[i];
}

void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

std::vector<DecodeOutput> DecodeEngine::run(const std::vector<DecodeRequest>& requests,
                                            const DecodeSampling& sampling) {
  return run(requests, sampling, DecodeHooks{});
}

std::vector<DecodeOutput> DecodeEngine::run(std::vector<DecodeRequest> requests, const DecodeSampling& sampling,
                                            const DecodeHooks& hooks) {
  c10::InferenceMode inference;
  if (hooks.reserve_positions < 0) {
    throw ValueError("DecodeEngine: reserve_positions must be >= 0, got " + std::to_string(hooks.reserve_positions));
  }
  if (hooks.admit && hooks.reserve_positions == 0) {
    throw ValueError("DecodeEngine: admitting requests during a run needs reserve_positions > 0");
  }
  if (hooks.reserve_positions > 0 && options_.max_batch <= 0) {
    throw ValueError("DecodeEngine: reserve_positions needs max_batch > 0 (the sequences the pool is sized for)");
  }
  cuda::validate(sampling.sampling);
  auto& st = *state_;
  if (st.aten ? !supports(model_) : !kernels_support(model_) || bf16_model(model_) != st.model_bf16) {
    throw ValueError(st.aten ? "DecodeEngine: the model's parameters are no longer of one floating dtype on one device"
                             : std::string("DecodeEngine: the model must have ") +
                                   (st.model_bf16 ? "bf16" : "float32") +
                                   " contiguous CPU parameters (the dtype it had when the engine was made)");
  }
  stats_ = DecodeStats{};

  // ---- refresh the packed weights that changed since the last run ----
  std::vector<const void*> packed_ptrs;
  if (st.aten) {
    stats_.pack_s = seconds_of([&] { stats_.packed_weights = st.aten->refresh_weights(); });
  }
  if (!st.aten) stats_.pack_s = seconds_of([&] {
    const auto sources = linear_weights(model_);
    st.packed.resize(sources.size());
    for (size_t i = 0; i < sources.size(); ++i) {
      const auto& src = sources[i];
      auto& pw = st.packed[i];
      if (!pw.current(src)) {
        const int64_t out = src.size(0), in = src.size(1);
        const int64_t size = st.bf16 ? decode::packed_bf16_words(in, out) : decode::packed_size(in, out);
        const auto dtype = st.bf16 ? at::kInt : at::kFloat;  // bf16: one 32-bit word per pair
        if (!pw.packed.defined() || pw.packed.numel() != size || pw.packed.scalar_type() != dtype) {
          pw.packed = at::empty({size}, dtype);
        }
        if (st.bf16) {
          // a bf16 model's weight widened first: packing rounds it back to itself exactly
          const auto f = st.model_bf16 ? src.to(at::kFloat) : src;
          decode::pack_weight_bf16(f.data_ptr<float>(), in, out, static_cast<uint32_t*>(pw.packed.data_ptr()));
        } else {
          decode::pack_weight(src.data_ptr<float>(), in, out, pw.packed.data_ptr<float>());
        }
        pw.made_from(src);
        ++stats_.packed_weights;
      }
      packed_ptrs.push_back(pw.packed.data_ptr());
    }
  });
  size_t widened = 0;
  const FloatOf float_of = [&](const at::Tensor& t) -> const float* {
    if (!st.model_bf16) return ptr(t);
    if (st.widened.size() <= widened) st.widened.resize(widened + 1);
    auto& c = st.widened[widened++];
    if (!c.current(t)) {
      c.packed = t.to(at::kFloat).contiguous();
      c.made_from(t);
    }
    return c.packed.data_ptr<float>();
  };
  const auto w = st.aten ? Weights{} : weights_of(model_, packed_ptrs, float_of);
  const int64_t bs = options_.block_size, kvdim = st.kvdim(), qdim = st.qdim(), D = st.head_dim;

  // ---- check the requests, size the cache and the rotary tables ----
  int64_t total_samples = 0, max_len = 0, max_pos = 0, max_n = 1;
  auto check = [&](const DecodeRequest& r, size_t i) {
    const auto where = "DecodeEngine: request " + std::to_string(i);
    if (r.prompt.empty()) throw ValueError(where + " has an empty prompt");
    if (r.n <= 0) throw ValueError(where + ": n must be > 0, got " + std::to_string(r.n));
    if (r.max_new_tokens <= 0) {
      throw ValueError(where + ": max_new_tokens must be > 0, got " + std::to_string(r.max_new_tokens));
    }
    if (r.first_step < 0) throw ValueError(where + ": first_step must be >= 0, got " + std::to_string(r.first_step));
    if (r.top_logprobs < 0 || r.top_logprobs > st.vocab) {
      throw ValueError(where + ": top_logprobs must be in [0, vocab], got " + std::to_string(r.top_logprobs));
    }
    if (r.top_logprobs > 0 && (!sampling.return_log_probs || st.aten)) {
      throw ValueError(where + " asks for top_logprobs, which need return_log_probs and the CPU kernels backend");
    }
    if (r.sampling) cuda::validate(*r.sampling);
    if (!r.positions.empty() && r.positions.size() != r.prompt.size()) {
      throw ShapeError(where + ": " + std::to_string(r.positions.size()) + " positions for " +
                       std::to_string(r.prompt.size()) + " prompt tokens");
    }
    for (auto t : r.prompt) {
      if (t < 0 || t >= st.vocab) {
        throw ValueError(where + ": token id " + std::to_string(t) + " outside the vocabulary of " +
                         std::to_string(st.vocab));
      }
    }
    const auto len = static_cast<int64_t>(r.prompt.size());
    const int64_t last_pos = r.positions.empty() ? len - 1 : r.positions.back();
    for (auto p : r.positions) {
      if (p < 0) throw ValueError(where + ": negative position " + std::to_string(p));
      max_pos = std::max(max_pos, p);
    }
    if (hooks.reserve_positions > 0 &&
        (len + r.max_new_tokens > hooks.reserve_positions || last_pos + r.max_new_tokens >= hooks.reserve_positions)) {
      throw ValueError(where + ": " + std::to_string(len) + " prompt + " + std::to_string(r.max_new_tokens) +
                       " new tokens exceed the run's reserve_positions " + std::to_string(hooks.reserve_positions));
    }
    if (hooks.reserve_positions > 0 && r.n > options_.max_batch) {
      throw ValueError(where + ": n " + std::to_string(r.n) + " exceeds max_batch " +
                       std::to_string(options_.max_batch));
    }
    max_pos = std::max(max_pos, last_pos + r.max_new_tokens);
    max_len = std::max(max_len, len + r.max_new_tokens);
  };
  // How each request's tokens are chosen: the run's settings (index 0) or one of the distinct
  // overrides of its requests; a step chooses the tokens of each settings' picks together.
  struct Settings {
    cuda::SamplingOptions sampling;
    uint64_t seed;
  };
  std::vector<Settings> settings{{sampling.sampling, sampling.seed}};
  std::vector<size_t> settings_of;  // per request
  auto add_settings = [&](const DecodeRequest& r) {
    const Settings s{r.sampling.value_or(sampling.sampling), r.seed.value_or(sampling.seed)};
    auto same = [&](const Settings& o) {
      if (o.sampling.is_greedy() || s.sampling.is_greedy()) return o.sampling.is_greedy() && s.sampling.is_greedy();
      return o.sampling.temperature == s.sampling.temperature && o.sampling.top_k == s.sampling.top_k &&
             o.sampling.top_p == s.sampling.top_p && o.sampling.min_p == s.sampling.min_p && o.seed == s.seed;
    };
    const auto it = std::find_if(settings.begin(), settings.end(), same);
    settings_of.push_back(static_cast<size_t>(it - settings.begin()));
    if (it == settings.end()) settings.push_back(s);
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    check(requests[i], i);
    add_settings(requests[i]);
    total_samples += requests[i].n;
    max_n = std::max(max_n, requests[i].n);
  }
  std::vector<DecodeOutput> outputs(static_cast<size_t>(total_samples));
  if (requests.empty() && hooks.reserve_positions == 0) return outputs;
  // A run with reserve_positions is sized for max_batch sequences of that many positions, whatever joins later.
  max_len = std::max(max_len, hooks.reserve_positions);
  max_pos = std::max(max_pos, hooks.reserve_positions);
  const int64_t max_batch = hooks.reserve_positions > 0
                                ? options_.max_batch
                                : std::max(options_.max_batch > 0 ? options_.max_batch : total_samples, max_n);

  // ---- size the KV pool ----
  // The blocks a request's samples can hold at once: each reaches prompt + max_new_tokens
  // positions; with prefix sharing the prompt's full blocks are held once for all n. Admission
  // reserves them, so the pool is never short mid-run.
  const int64_t block_bytes =
      st.aten ? st.aten->kv_block_bytes() : st.layers * 2 * bs * kvdim * st.kv_element_bytes();
  stats_.kv_block_bytes = block_bytes;
  std::vector<int64_t> own_blocks(requests.size()), shared_blocks(requests.size());
  auto size_blocks = [&](const DecodeRequest& r, size_t i) {
    const auto len = static_cast<int64_t>(r.prompt.size());
    const int64_t reach = (len + r.max_new_tokens + bs - 1) / bs;
    shared_blocks[i] = options_.share_prefix ? len / bs : 0;
    own_blocks[i] = reach - shared_blocks[i];
    return shared_blocks[i] + r.n * own_blocks[i];
  };
  int64_t all_at_once = 0, largest_need = 0;
  size_t largest = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    const int64_t need = size_blocks(r, i);
    all_at_once += need;
    if (need > largest_need) {
      largest_need = need;
      largest = i;
    }
  }
  // Every live sequence holds at most ceil(max_len / bs) blocks, and sharing only lowers that.
  int64_t blocks = max_batch * ((max_len + bs - 1) / bs);
  if (hooks.reserve_positions == 0) blocks = std::min(blocks, all_at_once);
  const int64_t held_bytes = kv_pool_bytes();
  int64_t budget = options_.kv_cache_bytes;
  if (options_.gpu_memory_utilization > 0.0) {
    const auto device = model_->model->embed_tokens->weight.device();
    DeviceMemoryFn info = options_.memory_info;
    if (!info && device.is_cuda()) info = cuda_device_memory;
    if (info) {
      const int64_t device_budget = kv_budget_bytes(options_.gpu_memory_utilization, info(device), held_bytes);
      budget = budget > 0 ? std::min(budget, device_budget) : device_budget;
    }
  }
  stats_.kv_pool_budget = budget;
  const int64_t most = budget > 0 ? budget / block_bytes : std::numeric_limits<int64_t>::max();
  if (largest_need > most) {
    const auto& r = requests[largest];
    throw ValueError("DecodeEngine: request " + std::to_string(largest) + " (" + std::to_string(r.n) + " x (" +
                     std::to_string(r.prompt.size()) + " prompt + " + std::to_string(r.max_new_tokens) +
                     " new tokens)) needs " + std::to_string(largest_need) + " KV blocks of " + std::to_string(bs) +
                     " positions (" + std::to_string(largest_need * block_bytes) + " bytes), but the budget of " +
                     std::to_string(budget) + " bytes holds " + std::to_string(most) + " blocks of " +
                     std::to_string(block_bytes) + " bytes");
  }
  blocks = std::min(blocks, most);
  if (st.aten) {
    st.kv_blocks = st.aten->prepare(blocks, most, max_pos);
  } else if (blocks > st.kv_blocks || st.kv_blocks > most || !st.kv.defined()) {
    st.kv = at::Tensor();  // the old pool goes before the new one is allocated
    st.kv = at::empty({st.layers * 2 * blocks * bs * kvdim},
                      at::TensorOptions().dtype(st.bf16 ? at::kShort : at::kFloat));  // bf16 as raw 16-bit words
    st.kv_blocks = blocks;
    // Transparent huge pages: a step reads each row's blocks at scattered places of the pool.
    decode::advise_huge_pages(st.kv.data_ptr(), st.kv.nbytes());
  }
  st.pool.reset(st.kv_blocks);
  stats_.kv_pool_blocks = st.kv_blocks;
  if (st.aten) st.aten->reset_peak_gather();
  if (!st.aten && (!st.cos.defined() || st.cos.size(0) <= max_pos)) {
    models::RotaryEmbedding rotary(D, model_->config().rope_theta, model_->config().rope_scaling);
    auto [cos, sin] = rotary.cos_sin(torch::arange(max_pos + 1, torch::kLong).unsqueeze(0), at::kFloat);
    st.cos = cos.reshape({max_pos + 1, D}).contiguous();
    st.sin = sin.reshape({max_pos + 1, D}).contiguous();
  }
  const float* cos_table = st.aten ? nullptr : st.cos.data_ptr<float>();
  const float* sin_table = st.aten ? nullptr : st.sin.data_ptr<float>();

  std::vector<int64_t> first_output(requests.size());
  for (size_t i = 0, o = 0; i < requests.size(); o += static_cast<size_t>(requests[i].n), ++i) {
    first_output[i] = static_cast<int64_t>(o);
  }

  // ---- one forward pass over rows ----
  std::vector<Sequence> seqs;  // indexed by Row::seq; finished ones are recycled via free_seqs
  std::vector<int64_t> free_seqs;
  auto forward = [&](const std::vector<Row>& rows, int64_t n_logits) {
    const int64_t R = static_cast<int64_t>(rows.size());
    if (R > st.row_capacity) {
      for (auto* buf : {&st.x, &st.xn}) grow(*buf, R * st.d);
      for (auto* buf : {&st.q, &st.att}) grow(*buf, R * qdim);
      for (auto* buf : {&st.k, &st.v}) grow(*buf, R * kvdim);
      for (auto* buf : {&st.gate, &st.up}) grow(*buf, R * st.inter);
      st.row_capacity = R;
    }
    if (n_logits > st.logit_capacity) {
      grow(st.logits, n_logits * st.vocab);
      st.logit_capacity = n_logits;
    }
    const int64_t threads = at::get_num_threads();
    grow(st.rotate_tmp, threads * D);
    float *x = st.x.data(), *xn = st.xn.data(), *q = st.q.data(), *k = st.k.data(), *v = st.v.data();
    float *att = st.att.data(), *gate = st.gate.data(), *up = st.up.data();
    // Each row's block table and the positions it attends to (its own included), for every layer.
    st.tables.resize(rows.size());
    st.lengths.resize(rows.size());
    st.logit_rows.clear();
    for (int64_t r = 0; r < R; ++r) {
      const auto& row = rows[static_cast<size_t>(r)];
      st.tables[static_cast<size_t>(r)] = seqs[static_cast<size_t>(row.seq)].blocks.data();
      st.lengths[static_cast<size_t>(r)] = row.index + 1;
      if (row.logits) st.logit_rows.push_back(r);
    }
    // Per-row work (rotary, KV writes) splits over the threads in chunks of at least this many rows.
    const int64_t row_grain = std::max<int64_t>(4, 8192 / std::max<int64_t>(1, qdim + kvdim));
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(x + r * st.d, w.embed + rows[r].token * st.d, static_cast<size_t>(st.d) * sizeof(float));
    }
    // x W^T + b on a packed weight, in the engine's dtype.
    auto linear = [&](const float* in_rows, int64_t ldx, const void* packed, const float* bias, int64_t in,
                      int64_t out, float* y, int64_t ldy, bool accumulate, int64_t rows) {
      if (st.bf16) {
        decode::linear_bf16(in_rows, ldx, rows, static_cast<const uint32_t*>(packed), bias, in, out, y, ldy,
                            accumulate);
      } else {
        decode::linear(in_rows, ldx, rows, static_cast<const float*>(packed), bias, in, out, y, ldy, accumulate);
      }
    };
    for (int64_t l = 0; l < st.layers; ++l) {
      const auto& L = w.layers[static_cast<size_t>(l)];
      decode::rms_norm_rows(x, nullptr, R, L.input_norm, st.d, st.eps, xn);
      linear(xn, st.d, L.wq, L.bq, st.d, qdim, q, qdim, false, R);
      linear(xn, st.d, L.wk, L.bk, st.d, kvdim, k, kvdim, false, R);
      linear(xn, st.d, L.wv, L.bv, st.d, kvdim, v, kvdim, false, R);
      char* keys = st.layer_kv(l, 0);
      char* values = st.layer_kv(l, 1);
      decode::parallel_for(0, R, row_grain, [&](int64_t r0, int64_t r1) {
        float* tmp = st.rotate_tmp.data() + at::get_thread_num() * D;
        for (int64_t r = r0; r < r1; ++r) {
          const auto& row = rows[static_cast<size_t>(r)];
          const float* c = cos_table + row.position * D;
          const float* s = sin_table + row.position * D;
          for (int64_t h = 0; h < st.heads; ++h) rotate(q + r * qdim + h * D, c, s, D, tmp);
          for (int64_t h = 0; h < st.kv_heads; ++h) rotate(k + r * kvdim + h * D, c, s, D, tmp);
          const int64_t slot = static_cast<int64_t>(st.tables[static_cast<size_t>(r)][row.index / bs]) * bs * kvdim +
                               (row.index % bs) * D;
          for (int64_t h = 0; h < st.kv_heads; ++h) {
            const float* kh = k + r * kvdim + h * D;
            const float* vh = v + r * kvdim + h * D;
            if (st.bf16) {
              auto* kb = reinterpret_cast<uint16_t*>(keys) + slot + h * bs * D;
              auto* vb = reinterpret_cast<uint16_t*>(values) + slot + h * bs * D;
              for (int64_t d = 0; d < D; ++d) {
                kb[d] = decode::to_bf16(kh[d]);
                vb[d] = decode::to_bf16(vh[d]);
              }
            } else {
              std::memcpy(reinterpret_cast<float*>(keys) + slot + h * bs * D, kh,
                          static_cast<size_t>(D) * sizeof(float));
              std::memcpy(reinterpret_cast<float*>(values) + slot + h * bs * D, vh,
                          static_cast<size_t>(D) * sizeof(float));
            }
          }
        }
      });
      if (st.bf16) {
        decode::attend_rows_bf16(q, reinterpret_cast<const uint16_t*>(keys), reinterpret_cast<const uint16_t*>(values),
                                 st.tables.data(), st.lengths.data(), R, st.heads, st.kv_heads, D, bs, att);
      } else {
        decode::attend_rows(q, reinterpret_cast<const float*>(keys), reinterpret_cast<const float*>(values),
                            st.tables.data(), st.lengths.data(), R, st.heads, st.kv_heads, D, bs, att);
      }
      linear(att, qdim, L.wo, L.bo, qdim, st.d, x, st.d, true, R);
      decode::rms_norm_rows(x, nullptr, R, L.post_norm, st.d, st.eps, xn);
      linear(xn, st.d, L.wg, L.bg, st.d, st.inter, gate, st.inter, false, R);
      linear(xn, st.d, L.wu, L.bu, st.d, st.inter, up, st.inter, false, R);
      decode::silu_mul(gate, up, R * st.inter);
      linear(gate, st.inter, L.wd, L.bd, st.inter, st.d, x, st.d, true, R);
    }
    // Final norm and logits for the rows that need them, packed.
    const auto j = static_cast<int64_t>(st.logit_rows.size());
    decode::rms_norm_rows(x, st.logit_rows.data(), j, w.final_norm, st.d, st.eps, xn);
    linear(xn, st.d, w.head, nullptr, st.d, st.vocab, st.logits.data(), st.vocab, false, j);
  };

  // ---- token choice ----
  struct Pick {
    int64_t logits_row, seq, output, step, row_id;
  };
  std::vector<int64_t> chosen;
  std::vector<float> chosen_lp;
  std::vector<std::vector<TokenLogProb>> chosen_top;  // per pick: the request's top_logprobs alternatives
  auto request_of = [&](const Pick& p) { return static_cast<size_t>(seqs[static_cast<size_t>(p.seq)].request); };
  // Chooses the tokens of picks[members] (one settings' picks) into chosen, chosen_lp and chosen_top.
  auto choose = [&](const std::vector<Pick>& picks, const std::vector<size_t>& members, const Settings& set) {
    const bool greedy = set.sampling.is_greedy();
    const double lp_temperature = greedy ? 1.0 : set.sampling.temperature;
    const float* logits = st.logits.data();
    const auto n_members = static_cast<int64_t>(members.size());
    const int64_t pick_grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, st.vocab));
    if (greedy) {
      decode::parallel_for(0, n_members, pick_grain, [&](int64_t m0, int64_t m1) {
        for (auto m = static_cast<size_t>(m0); m < static_cast<size_t>(m1); ++m) {
          // The first maximum: the lowest id on ties.
          const size_t i = members[m];
          chosen[i] = decode::argmax(logits + picks[i].logits_row * st.vocab, st.vocab);
        }
      });
    } else {
      // Counter-based sampling, grouped by step: a token depends on (seed, row id, step) only.
      std::map<int64_t, std::vector<size_t>> by_step;
      for (auto i : members) by_step[picks[i].step].push_back(i);
      auto all = torch::from_blob(const_cast<float*>(logits), {st.logit_capacity, st.vocab}, at::kFloat);
      for (const auto& [step, at_step] : by_step) {
        std::vector<int64_t> index, ids;
        for (auto i : at_step) {
          index.push_back(picks[i].logits_row);
          ids.push_back(picks[i].row_id);
        }
        auto z = all.index_select(0, torch::tensor(index, torch::kLong));
        auto tokens = cuda::sample_seeded(z, set.sampling, set.seed, static_cast<uint64_t>(step),
                                          torch::tensor(ids, torch::kLong));
        auto acc = tokens.accessor<int64_t, 1>();
        for (size_t m = 0; m < at_step.size(); ++m) chosen[at_step[m]] = acc[static_cast<int64_t>(m)];
      }
    }
    if (sampling.return_log_probs) {
      decode::parallel_for(0, n_members, pick_grain, [&](int64_t m0, int64_t m1) {
        for (auto m = static_cast<size_t>(m0); m < static_cast<size_t>(m1); ++m) {
          const size_t i = members[m];
          const float* z = logits + picks[i].logits_row * st.vocab;
          double max_z = -std::numeric_limits<double>::infinity();
          for (int64_t t = 0; t < st.vocab; ++t)
            max_z = std::max<double>(max_z, z[t] / static_cast<float>(lp_temperature));
          double total = 0.0;
          for (int64_t t = 0; t < st.vocab; ++t) total += std::exp(z[t] / static_cast<float>(lp_temperature) - max_z);
          const double log_total = std::log(total);
          chosen_lp[i] = static_cast<float>(z[chosen[i]] / static_cast<float>(lp_temperature) - max_z - log_total);
          // The k largest logits (a min-heap of k: the first at the front is the one to drop).
          const auto k = static_cast<size_t>(requests[request_of(picks[i])].top_logprobs);
          auto& top = chosen_top[i];
          top.clear();
          if (k == 0) continue;
          auto better = [](const TokenLogProb& a, const TokenLogProb& b) {
            return a.log_prob > b.log_prob || (a.log_prob == b.log_prob && a.token < b.token);
          };
          for (int64_t t = 0; t < st.vocab; ++t) {
            const TokenLogProb c{t, z[t]};
            if (top.size() < k) {
              top.push_back(c);
              std::push_heap(top.begin(), top.end(), better);
            } else if (better(c, top.front())) {
              std::pop_heap(top.begin(), top.end(), better);
              top.back() = c;
              std::push_heap(top.begin(), top.end(), better);
            }
          }
          std::sort_heap(top.begin(), top.end(), better);
          for (auto& c : top) {
            c.log_prob = static_cast<float>(c.log_prob / static_cast<float>(lp_temperature) - max_z - log_total);
          }
        }
      });
    }
  };

  // ---- the scheduler ----
  std::deque<int64_t> queue;
  for (size_t i = 0; i < requests.size(); ++i) queue.push_back(static_cast<int64_t>(i));
  std::vector<int64_t> running;  // sequence ids decoding
  auto new_seq = [&]() -> int64_t {
    if (!free_seqs.empty()) {
      const int64_t id = free_seqs.back();
      free_seqs.pop_back();
      seqs[static_cast<size_t>(id)] = Sequence{};
      return id;
    }
    seqs.emplace_back();
    return static_cast<int64_t>(seqs.size()) - 1;
  };
  auto finish = [&](int64_t id) {
    for (auto b : seqs[static_cast<size_t>(id)].blocks) st.pool.release(b);
    seqs[static_cast<size_t>(id)].blocks.clear();
    free_seqs.push_back(id);
  };
  auto place = [&](Sequence& seq) {  // room for position seq.length
    if (seq.length % bs == 0) seq.blocks.push_back(st.pool.allocate());
  };

  std::vector<Row> rows;
  std::vector<Pick> picks;
  std::vector<int64_t> logit_rows_of_prefill;  // per admitted prefill sequence: its logits row
  int64_t live = 0;                            // sequences holding a slot (running or prefilling)
  int64_t reserved = 0;                        // blocks the admitted requests can reach
  std::vector<int64_t> unfinished(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) unfinished[i] = requests[i].n;
  // Requests the admit hook hands over join the queue; their outputs follow the earlier ones.
  auto admit_more = [&] {
    if (!hooks.admit) return;
    for (auto& r : hooks.admit()) {
      const size_t i = requests.size();
      check(r, i);
      add_settings(r);
      own_blocks.push_back(0);
      shared_blocks.push_back(0);
      const int64_t need = size_blocks(r, i);
      if (need > st.kv_blocks) {
        throw ValueError("DecodeEngine: request " + std::to_string(i) + " needs " + std::to_string(need) +
                         " KV blocks, the run's pool holds " + std::to_string(st.kv_blocks));
      }
      first_output.push_back(static_cast<int64_t>(outputs.size()));
      outputs.resize(outputs.size() + static_cast<size_t>(r.n));
      unfinished.push_back(r.n);
      requests.push_back(std::move(r));
      queue.push_back(static_cast<int64_t>(i));
    }
  };
  while (true) {
    if (hooks.pause && hooks.pause()) break;  // the unfinished outputs keep the tokens chosen so far
    admit_more();
    if (queue.empty() && running.empty()) break;
    rows.clear();
    picks.clear();
    int64_t n_logits = 0;
    for (auto id : running) {
      auto& seq = seqs[static_cast<size_t>(id)];
      place(seq);
      rows.push_back(Row{seq.token, id, seq.length, seq.next_pos, true});
      ++seq.length;
      ++seq.next_pos;
      const auto& out = outputs[static_cast<size_t>(first_output[static_cast<size_t>(seq.request)] + seq.sample)];
      picks.push_back(Pick{
          n_logits++, id, first_output[static_cast<size_t>(seq.request)] + seq.sample,
          requests[static_cast<size_t>(seq.request)].first_step + static_cast<int64_t>(out.tokens.size()), seq.row_id});
    }
    // Admit queued prompts into free slots.
    std::vector<int64_t> prefilled;  // sequence ids whose prompt runs in this pass
    int64_t prefill_tokens = 0;
    while (!queue.empty()) {
      const auto& req = requests[static_cast<size_t>(queue.front())];
      const auto len = static_cast<int64_t>(req.prompt.size());
      const int64_t copies = options_.share_prefix ? 1 : req.n;
      const auto ri = static_cast<size_t>(queue.front());
      const int64_t need = shared_blocks[ri] + req.n * own_blocks[ri];
      if (live + req.n > max_batch || reserved + need > st.kv_blocks) break;  // waits for blocks to free
      if (!prefilled.empty() && prefill_tokens + copies * len > options_.max_prefill_tokens) break;
      const int64_t r = queue.front();
      queue.pop_front();
      live += req.n;
      reserved += need;
      for (int64_t c = 0; c < copies; ++c) {
        const int64_t id = new_seq();
        auto& seq = seqs[static_cast<size_t>(id)];
        seq.request = r;
        seq.sample = options_.share_prefix ? -1 : c;
        seq.row_id = req.first_row_id + (options_.share_prefix ? 0 : c);
        for (int64_t t = 0; t < len; ++t) {
          place(seq);
          const int64_t pos = req.positions.empty() ? t : req.positions[static_cast<size_t>(t)];
          rows.push_back(Row{req.prompt[static_cast<size_t>(t)], id, seq.length, pos, t + 1 == len});
          ++seq.length;
          seq.next_pos = pos + 1;
        }
        prefilled.push_back(id);
        prefill_tokens += len;
      }
    }
    if (rows.empty()) {
      throw Error("DecodeEngine: nothing running and request " + std::to_string(queue.front()) +
                  " not admitted; this is a scheduling bug");
    }
    // Logits rows are packed in row order: decode rows first, then each prefill's last row.
    const int64_t first_prefill_logits = n_logits;
    n_logits += static_cast<int64_t>(prefilled.size());
    const double dt = seconds_of([&] {
      if (!st.aten) return forward(rows, n_logits);
      std::vector<decode::AtenRow> pass;  // the ATen backend's view of the rows
      pass.reserve(rows.size());
      for (const auto& row : rows) {
        const auto& blocks = seqs[static_cast<size_t>(row.seq)].blocks;
        pass.push_back(decode::AtenRow{row.token, row.position, row.index, blocks.data(),
                                       static_cast<int64_t>(blocks.size()), row.logits});
      }
      st.aten->forward(pass);
    });
    ++stats_.steps;
    stats_.prefill_tokens += prefill_tokens;
    stats_.decode_tokens += static_cast<int64_t>(running.size());
    (prefilled.empty() ? stats_.decode_s : stats_.prefill_s) += dt;

    // Fork each shared prefill into its samples: full blocks shared, the partial block copied.
    for (size_t p = 0; p < prefilled.size(); ++p) {
      const int64_t logits_row = first_prefill_logits + static_cast<int64_t>(p);
      const int64_t prompt_id = prefilled[p];
      const int64_t r = seqs[static_cast<size_t>(prompt_id)].request;
      const auto& req = requests[static_cast<size_t>(r)];
      if (!options_.share_prefix) {
        const auto& seq = seqs[static_cast<size_t>(prompt_id)];
        picks.push_back(
            Pick{logits_row, prompt_id, first_output[static_cast<size_t>(r)] + seq.sample, req.first_step, seq.row_id});
        continue;
      }
      std::vector<int64_t> ids{prompt_id};
      for (int64_t j = 1; j < req.n; ++j) {
        const int64_t id = new_seq();
        const auto& src = seqs[static_cast<size_t>(prompt_id)];  // re-read: new_seq may grow seqs
        auto& dst = seqs[static_cast<size_t>(id)];
        dst = src;
        const int64_t full = src.length / bs;
        for (int64_t b = 0; b < full; ++b) st.pool.retain(src.blocks[static_cast<size_t>(b)]);
        if (src.length % bs != 0) {
          const int32_t copy = st.pool.allocate();
          const int32_t from = src.blocks[static_cast<size_t>(full)];
          if (st.aten) st.aten->copy_positions(from, copy, src.length % bs);
          const int64_t e = st.kv_element_bytes();
          const auto count = static_cast<size_t>((src.length % bs) * D * e);  // per head
          for (int64_t l = 0; !st.aten && l < st.layers; ++l) {
            for (char* base : {st.layer_kv(l, 0), st.layer_kv(l, 1)}) {
              for (int64_t h = 0; h < st.kv_heads; ++h) {
                std::memcpy(base + (copy * st.kv_heads + h) * bs * D * e, base + (from * st.kv_heads + h) * bs * D * e,
                            count);
              }
            }
          }
          seqs[static_cast<size_t>(id)].blocks[static_cast<size_t>(full)] = copy;
        }
        ids.push_back(id);
      }
      for (int64_t j = 0; j < req.n; ++j) {
        auto& seq = seqs[static_cast<size_t>(ids[static_cast<size_t>(j)])];
        seq.sample = j;
        seq.row_id = req.first_row_id + j;
        picks.push_back(Pick{logits_row, ids[static_cast<size_t>(j)], first_output[static_cast<size_t>(r)] + j,
                             req.first_step, seq.row_id});
      }
    }

    // Choose tokens, the picks of each settings together; finished samples leave the batch and
    // free their slots at once.
    chosen.assign(picks.size(), 0);
    chosen_lp.assign(picks.size(), 0.0F);
    chosen_top.resize(picks.size());
    std::map<size_t, std::vector<size_t>> by_settings;
    for (size_t i = 0; i < picks.size(); ++i) by_settings[settings_of[request_of(picks[i])]].push_back(i);
    for (const auto& [s, members] : by_settings) {
      if (!st.aten) {
        choose(picks, members, settings[s]);
        continue;
      }
      std::vector<decode::AtenPick> aten_picks;
      aten_picks.reserve(members.size());
      for (auto i : members) {
        aten_picks.push_back(decode::AtenPick{picks[i].logits_row, picks[i].step, picks[i].row_id});
      }
      DecodeSampling group = sampling;
      group.sampling = settings[s].sampling;
      group.seed = settings[s].seed;
      std::vector<int64_t> tokens;
      std::vector<float> log_probs;
      st.aten->choose(aten_picks, group, tokens, log_probs);
      for (size_t m = 0; m < members.size(); ++m) {
        chosen[members[m]] = tokens[m];
        chosen_lp[members[m]] = log_probs[m];
      }
    }
    std::vector<int64_t> next;
    next.reserve(running.size() + picks.size());
    for (size_t i = 0; i < picks.size(); ++i) {
      const auto& pick = picks[i];
      auto& out = outputs[static_cast<size_t>(pick.output)];
      out.tokens.push_back(chosen[i]);
      if (sampling.return_log_probs) out.log_probs.push_back(chosen_lp[i]);
      auto& seq = seqs[static_cast<size_t>(pick.seq)];
      const auto& req = requests[static_cast<size_t>(seq.request)];
      const bool eos = std::find(sampling.eos_token_ids.begin(), sampling.eos_token_ids.end(), chosen[i]) !=
                       sampling.eos_token_ids.end();
      if (hooks.on_top_logprobs && !st.aten && !chosen_top[i].empty()) {
        hooks.on_top_logprobs(pick.output, chosen_top[i]);
      }
      const bool stopped =
          hooks.on_token && !hooks.on_token(pick.output, chosen[i], sampling.return_log_probs ? chosen_lp[i] : 0.0F);
      if (eos || stopped || static_cast<int64_t>(out.tokens.size()) >= req.max_new_tokens) {
        const auto ri = static_cast<size_t>(seq.request);
        finish(pick.seq);
        --live;
        reserved -= own_blocks[ri] + (--unfinished[ri] == 0 ? shared_blocks[ri] : 0);
      } else {
        seq.token = chosen[i];
        next.push_back(pick.seq);
      }
    }
    running.swap(next);
  }
  stats_.peak_kv_blocks = st.pool.peak();
  if (st.aten) stats_.attention_gather_elements = st.aten->peak_gather_elements();
  return outputs;
}

}  // namespace hyflow::inference
