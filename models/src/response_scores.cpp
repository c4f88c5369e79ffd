#include <hyflow/models/response_scores.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/cuda/log_probs.hpp>
#include <hyflow/dataproto/position_ids.hpp>

#include <torch/torch.h>

namespace hyflow::models {

ResponseScores response_scores_from_logits(const at::Tensor& logits, const at::Tensor& responses,
                                           const ScoreOptions& options) {
  if (logits.dim() != 3 || responses.dim() != 2 || responses.size(0) != logits.size(0) ||
      responses.size(1) >= logits.size(1)) {
    throw ShapeError("response scores: need logits (B, T, V) and responses (B, R) with R < T");
  }
  if (!(options.temperature > 0)) throw ValueError("response scores: temperature must be > 0");
  const int64_t R = responses.size(1), T = logits.size(1);
  // (B, T, V) -> (B, R, V): position t predicts token t + 1
  auto z = logits.narrow(1, T - R - 1, R);
  if (options.temperature != 1.0) z = z / options.temperature;
  // One fused call for both: the kernel path makes (and autograd saves) one contiguous copy of
  // these (B, R, V) logits, not one for the log-probs and another for the entropy.
  auto scores = cuda::log_probs_and_entropy(
      z, responses, {.with_entropy = options.with_entropy, .impl = options.impl, .chunk_rows = options.chunk_rows});
  return {scores.log_probs, scores.entropy};
}

ResponseScores compute_response_scores(CausalLM& model, const DataProto& batch, const ScoreOptions& options) {
  for (const char* key : {"input_ids", "attention_mask", "responses"}) {
    if (!batch.batch.contains(key)) throw KeyError(std::string("response scores: batch needs '") + key + "'");
  }
  const auto& mask = batch.batch.at("attention_mask");
  auto positions = batch.batch.contains("position_ids") ? batch.batch.at("position_ids") : position_ids_from_mask(mask);
  auto logits = model(batch.batch.at("input_ids"), mask, positions);
  return response_scores_from_logits(logits, batch.batch.at("responses"), options);
}

}  // namespace hyflow::models
