#pragma once
// verl's rollout batch from the samples of a decode, laid out as inference::generate lays it out.
// Shared by generate()'s decode-engine path and rollout backends that get their tokens elsewhere
// (the `server` backend's HTTP answers), so that both give the same columns, shapes and padding.

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/inference/decode_engine.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hyflow::inference {

/// Left-padded prompts (`prompt_ids`, `prompt_mask`, `prompt_pos`: (B, P) int64 on the host) and
/// their B*n samples (sample i answers prompt row i / n; at most `response_length` tokens) ->
/// prompts (B*n, P), responses (B*n, R) padded with `pad_id`, input_ids, attention_mask,
/// position_ids (continuing each row's last prompt position), response_mask, rollout_log_probs
/// when `with_log_probs`, and `prompts`' non-tensor columns repeated and meta_info copied.
DataProto rollout_batch_from_samples(const DataProto& prompts, const at::Tensor& prompt_ids,
                                     const at::Tensor& prompt_mask, const at::Tensor& prompt_pos,
                                     const std::vector<DecodeOutput>& samples, int64_t n, int64_t response_length,
                                     int64_t pad_id, bool with_log_probs);

}  // namespace hyflow::inference
