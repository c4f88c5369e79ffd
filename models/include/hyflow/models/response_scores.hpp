#pragma once
// Log-probs and entropy of response tokens with verl's alignment: the logits at position t
// score token t + 1, so responses of length R are scored by logits[:, -R-1:-1] after the
// logits are divided by the rollout temperature.

#include <hyflow/cuda/dispatch.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/models/llama.hpp>

#include <ATen/core/Tensor.h>

namespace hyflow::models {

struct ScoreOptions {
  double temperature = 1.0;
  bool with_entropy = false;
  int64_t chunk_rows = 2048;  ///< rows per chunk of the float32 log-softmax / entropy (the reference)
  /// Log-probs and entropy come from one cuda::log_probs_and_entropy call: the fused kernel for
  /// CUDA logits (one read, one saved copy of the logits for both), the reference for CPU ones.
  cuda::Impl impl = cuda::Impl::by_device;
};

/// log_probs (B, R) float32 and, when asked, entropy (B, R) float32.
struct ResponseScores {
  at::Tensor log_probs;
  at::Tensor entropy;
};

/// From logits (B, T, V) of prompt + response and responses (B, R), R < T.
ResponseScores response_scores_from_logits(const at::Tensor& logits, const at::Tensor& responses,
                                           const ScoreOptions& options = {});

/// Runs the model on batch["input_ids"], ["attention_mask"], ["position_ids"] and scores
/// batch["responses"]. Differentiable when grad mode is on (the actor's update).
ResponseScores compute_response_scores(CausalLM& model, const DataProto& batch, const ScoreOptions& options = {});

}  // namespace hyflow::models
