#include <hyflow/inference/generation.hpp>
#include <hyflow/inference/rollout_batch.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/cuda/log_probs.hpp>
#include <hyflow/dataproto/position_ids.hpp>

#include <torch/torch.h>

#include <optional>

namespace hyflow::inference {
namespace {

void check_prompts(const DataProto& prompts, const GenerationOptions& options) {
  for (const char* key : {"input_ids", "attention_mask"}) {
    if (!prompts.batch.contains(key)) throw KeyError(std::string("generate: prompts need the tensor '") + key + "'");
  }
  const auto& ids = prompts.batch.at("input_ids");
  if (ids.dim() != 2 || prompts.batch.at("attention_mask").sizes() != ids.sizes()) {
    throw ShapeError("generate: input_ids and attention_mask must both be (B, P)");
  }
  if (options.max_new_tokens <= 0) {
    throw ValueError("generate: max_new_tokens must be > 0, got " + std::to_string(options.max_new_tokens));
  }
  if (options.n <= 0) throw ValueError("generate: n must be > 0, got " + std::to_string(options.n));
}

}  // namespace

namespace {

// The batch verl's generate_sequences returns, from prompts already repeated n times
// (interleaved) and their responses: positions continue each row's last prompt position, and
// the prompts' non-tensor columns are repeated the same way.
DataProto rollout_batch(const DataProto& prompts, const at::Tensor& prompt_ids, const at::Tensor& prompt_mask,
                        const at::Tensor& prompt_pos, const at::Tensor& responses, const at::Tensor& response_mask,
                        const std::optional<at::Tensor>& log_probs, int64_t n) {
  const int64_t P = prompt_ids.size(1), R = responses.size(1);
  auto last_pos = prompt_pos.select(1, P - 1);
  auto response_pos = last_pos.unsqueeze(1) + torch::arange(1, R + 1, prompt_pos.options()).unsqueeze(0);
  TensorDict batch{
      {"prompts", prompt_ids},
      {"responses", responses},
      {"input_ids", torch::cat({prompt_ids, responses}, 1)},
      {"attention_mask", torch::cat({prompt_mask, response_mask}, 1)},
      {"position_ids", torch::cat({prompt_pos, response_pos}, 1)},
      {"response_mask", response_mask},
  };
  if (log_probs) batch.set("rollout_log_probs", *log_probs);
  dataproto::NonTensorBatch columns;
  if (!prompts.non_tensor_batch.empty()) {
    columns = DataProto(TensorDict::with_batch_size(prompt_ids.size(0) / n), prompts.non_tensor_batch)
                  .repeat(n, /*interleave=*/true)
                  .non_tensor_batch;
  }
  return DataProto(std::move(batch), std::move(columns), prompts.meta_info);
}

DataProto generate_inference(models::CausalLM& model, const DataProto& prompts, const GenerationOptions& options) {
  const auto& config = model->config();
  const auto eos_ids = options.eos_token_ids.empty() ? config.eos_token_ids : options.eos_token_ids;
  const int64_t pad_id = options.pad_token_id >= 0 ? options.pad_token_id : config.resolved_pad_token_id();
  auto sampling = options.sampling;
  if (!options.do_sample) sampling.greedy = true;
  cuda::validate(sampling);
  const double logprob_temperature = sampling.is_greedy() ? 1.0 : sampling.temperature;

  auto prompt_ids = prompts.batch.at("input_ids").to(at::kLong);
  auto prompt_mask = prompts.batch.at("attention_mask").to(at::kLong);
  auto prompt_pos = prompts.batch.contains("position_ids") ? prompts.batch.at("position_ids").to(at::kLong)
                                                           : position_ids_from_mask(prompt_mask);
  const int64_t B = prompt_ids.size(0), P = prompt_ids.size(1), R = options.max_new_tokens, N = B * options.n;
  auto param = model->parameters().front();

  // The generation's state (KV cache, packed weights). Prefill once per prompt, then give
  // each of the n samples its own copy of the cache.
  models::InferenceContext context(config, B, P + R, param.options());
  // Only the last prompt position's logits are needed: (B, P, d) -> (B, d) -> (B, V).
  auto logits = model->logits(model->model(prompt_ids, prompt_mask, prompt_pos, &context).select(1, P - 1), &context);
  if (options.n > 1) {
    context.repeat_interleave(options.n);
    logits = logits.repeat_interleave(options.n, 0);
    prompt_ids = prompt_ids.repeat_interleave(options.n, 0);
    prompt_mask = prompt_mask.repeat_interleave(options.n, 0);
    prompt_pos = prompt_pos.repeat_interleave(options.n, 0);
  }

  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  auto responses = torch::full({N, R}, pad_id, prompt_ids.options());
  auto response_mask = torch::zeros({N, R}, prompt_ids.options());
  auto log_probs = torch::zeros({N, R}, param.options().dtype(at::kFloat));
  auto full_mask = torch::cat({prompt_mask, torch::ones({N, R}, prompt_mask.options())}, 1);  // (N, P+R)
  auto last_pos = prompt_pos.select(1, P - 1);                                                // (N,)
  auto finished = torch::zeros({N}, prompt_ids.options().dtype(at::kBool));
  auto eos = torch::tensor(eos_ids, prompt_ids.options());

  for (int64_t step = 0; step < R; ++step) {
    // A CPU generator cannot draw on a device: there rows are sampled by the counter-based
    // sampler, keyed by (seed, row, step), which needs no generator (the seam to the GPU path).
    auto tokens = logits.device().is_cpu() ? cuda::sample(logits, sampling, generator)
                                           : cuda::sample_seeded(logits, sampling, options.seed,
                                                                 static_cast<uint64_t>(step));  // (N,)
    tokens = tokens.masked_fill(finished, pad_id);
    responses.select(1, step).copy_(tokens);
    response_mask.select(1, step).copy_(finished.logical_not());
    if (options.return_log_probs) {
      auto lp = cuda::log_probs_from_logits(logits / logprob_temperature, tokens);
      log_probs.select(1, step).copy_(lp.masked_fill(finished, 0.0));
    }
    if (eos.numel() > 0) finished = finished.logical_or(at::isin(tokens, eos));
    if (step + 1 == R || finished.all().item<bool>()) break;
    auto position = (last_pos + step + 1).unsqueeze(1);  // (N, 1)
    logits = model(tokens.unsqueeze(1), full_mask.narrow(1, 0, P + step + 1), position, &context).select(1, 0);
  }

  return rollout_batch(prompts, prompt_ids, prompt_mask, prompt_pos, responses, response_mask,
                       options.return_log_probs ? std::optional<at::Tensor>(log_probs) : std::nullopt, options.n);
}

// Whether GenerationEngine::kDecode can take these prompts: a model the engine runs (float32
// CPU on its kernels; another dtype or a device on its ATen backend), prompts whose last column
// is a real token in every row (left padding, as verl pads).
bool decode_engine_applies(const models::CausalLM& model, const DataProto& prompts) {
  const auto& mask = prompts.batch.at("attention_mask");
  if (mask.size(1) == 0 || !DecodeEngine::supports(model)) return false;
  return mask.select(1, mask.size(1) - 1).ne(0).all().item<bool>();
}

// The rollout batch of generate_inference, from the decode engine: each row's real prompt
// tokens (mask 1) with their position ids form one request of n samples. `engine`: a long-lived
// engine on `model`; null: a fresh one for this call.
DataProto generate_decode(models::CausalLM& model, const DataProto& prompts, const GenerationOptions& options,
                          DecodeEngine* engine) {
  const auto& config = model->config();
  DecodeSampling sampling{.sampling = options.sampling,
                          .seed = options.seed,
                          .eos_token_ids = options.eos_token_ids.empty() ? config.eos_token_ids : options.eos_token_ids,
                          .return_log_probs = options.return_log_probs};
  if (!options.do_sample) sampling.sampling.greedy = true;
  const int64_t pad_id = options.pad_token_id >= 0 ? options.pad_token_id : config.resolved_pad_token_id();

  // The scheduler reads the prompts on the host; the rollout goes back to the prompts' device.
  const auto device = prompts.batch.at("input_ids").device();
  auto prompt_ids = prompts.batch.at("input_ids").to(at::kCPU, at::kLong).contiguous();
  auto prompt_mask = prompts.batch.at("attention_mask").to(at::kCPU, at::kLong).contiguous();
  auto prompt_pos = prompts.batch.contains("position_ids") ? prompts.batch.at("position_ids").to(at::kCPU, at::kLong)
                                                           : position_ids_from_mask(prompt_mask);
  prompt_pos = prompt_pos.contiguous();
  const int64_t B = prompt_ids.size(0), P = prompt_ids.size(1), R = options.max_new_tokens, n = options.n;
  std::vector<DecodeRequest> requests(static_cast<size_t>(B));
  auto ids_a = prompt_ids.accessor<int64_t, 2>();
  auto mask_a = prompt_mask.accessor<int64_t, 2>();
  auto pos_a = prompt_pos.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    auto& req = requests[static_cast<size_t>(b)];
    for (int64_t t = 0; t < P; ++t) {
      if (mask_a[b][t] == 0) continue;
      req.prompt.push_back(ids_a[b][t]);
      req.positions.push_back(pos_a[b][t]);
    }
    req.n = n;
    req.max_new_tokens = R;
    req.first_row_id = b * n;
  }
  std::optional<DecodeEngine> fresh;
  if (!engine) engine = &fresh.emplace(model, options.decode);
  const auto samples = engine->run(requests, sampling);

  auto out = rollout_batch_from_samples(prompts, prompt_ids, prompt_mask, prompt_pos, samples, n, R, pad_id,
                                       options.return_log_probs);
  if (!device.is_cpu()) out.to(device);
  return out;
}

DataProto generate_with(models::CausalLM& model, const DataProto& prompts, const GenerationOptions& options,
                        DecodeEngine* engine) {
  check_prompts(prompts, options);
  DataProto out;
  if (options.engine == GenerationEngine::kDecode && decode_engine_applies(model, prompts)) {
    out = generate_decode(model, prompts, options, engine);
    return out;  // built outside inference mode: ordinary tensors
  }
  {
    // Inference mode skips autograd and version-counter bookkeeping on every op of the loop.
    c10::InferenceMode inference;
    out = generate_inference(model, prompts, options);
  }
  // Tensors made in inference mode cannot enter autograd later (the actor's update embeds
  // these ids): hand back ordinary copies.
  for (const auto& key : out.batch.keys()) out.batch.set(key, out.batch.at(key).clone());
  return out;
}

}  // namespace

DataProto rollout_batch_from_samples(const DataProto& prompts, const at::Tensor& prompt_ids,
                                     const at::Tensor& prompt_mask, const at::Tensor& prompt_pos,
                                     const std::vector<DecodeOutput>& samples, int64_t n, int64_t response_length,
                                     int64_t pad_id, bool with_log_probs) {
  const int64_t N = prompt_ids.size(0) * n, R = response_length;
  if (static_cast<int64_t>(samples.size()) != N)
    throw ShapeError("rollout_batch_from_samples: " + std::to_string(samples.size()) + " samples for " +
                     std::to_string(prompt_ids.size(0)) + " prompts x n = " + std::to_string(n));
  auto responses = torch::full({N, R}, pad_id, torch::kLong);
  auto response_mask = torch::zeros({N, R}, torch::kLong);
  auto log_probs = torch::zeros({N, R}, torch::kFloat);
  auto resp_a = responses.accessor<int64_t, 2>();
  auto rmask_a = response_mask.accessor<int64_t, 2>();
  auto lp_a = log_probs.accessor<float, 2>();
  for (int64_t i = 0; i < N; ++i) {
    const auto& s = samples[static_cast<size_t>(i)];
    if (static_cast<int64_t>(s.tokens.size()) > R)
      throw ShapeError("rollout_batch_from_samples: sample " + std::to_string(i) + " has " +
                       std::to_string(s.tokens.size()) + " tokens, more than the response length " + std::to_string(R));
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      resp_a[i][static_cast<int64_t>(t)] = s.tokens[t];
      rmask_a[i][static_cast<int64_t>(t)] = 1;
      if (with_log_probs) lp_a[i][static_cast<int64_t>(t)] = s.log_probs[t];
    }
  }
  auto ids = prompt_ids, mask = prompt_mask, pos = prompt_pos;
  if (n > 1) {
    ids = ids.repeat_interleave(n, 0);
    mask = mask.repeat_interleave(n, 0);
    pos = pos.repeat_interleave(n, 0);
  }
  return rollout_batch(prompts, ids, mask, pos, responses, response_mask,
                       with_log_probs ? std::optional<at::Tensor>(log_probs) : std::nullopt, n);
}

DataProto generate(models::CausalLM& model, const DataProto& prompts, const GenerationOptions& options) {
  return generate_with(model, prompts, options, nullptr);
}

DataProto generate(models::CausalLM& model, const DataProto& prompts, const GenerationOptions& options,
                   DecodeEngine& engine) {
  return generate_with(model, prompts, options, &engine);
}

}  // namespace hyflow::inference
