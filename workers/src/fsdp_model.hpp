#pragma once
// The role models under FSDP (hyflow/parallel/fsdp.hpp): building the engine from a role's
// strategy / fsdp_config, and the forward passes that bracket each decoder layer with the
// engine's unit boundaries (the models' own forward has no per-layer hooks).

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/models/response_scores.hpp>
#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/workers/config.hpp>

#include <memory>
#include <string>

namespace hyflow::workers::detail {

/// The sharding engine of `model` for the role's fsdp config over `group` (null: one rank), or
/// null when the mesh does not shard and the precision is fp32 (one rank, or fsdp_size 1: the
/// replicated DDP path, bit-equal to it); mixed precision on one rank gets a replicated engine.
/// Casts the model's floating-point buffers to mixed_precision.buffer_dtype. `tag` names the role
/// (sub-group keys); `path` the config section in errors. Every rank must call it (sub-groups
/// rendezvous); the model's weights must already be equal on all ranks.
std::shared_ptr<parallel::FsdpModule> shard_model(torch::nn::Module& model,
                                                  const std::shared_ptr<parallel::ProcessGroup>& group,
                                                  const FsdpSection& config, const std::string& tag,
                                                  const std::string& path);

/// TransformerImpl::forward without a KV cache, each decoder layer one unit of `fsdp`; the
/// root unit (embeddings, final norm, heads) stays gathered until finish_backward / end_forward.
at::Tensor sharded_hidden_states(models::TransformerImpl& transformer, const models::ModelConfig& config,
                                 parallel::FsdpModule& fsdp, const at::Tensor& input_ids,
                                 const at::Tensor& attention_mask, const at::Tensor& position_ids);

/// models::compute_response_scores through the sharded forward when `fsdp` is set, the logits
/// through FsdpModule::head. Without grad mode the engine frees everything before returning.
models::ResponseScores response_scores(models::CausalLM& model, parallel::FsdpModule* fsdp, const DataProto& batch,
                                       const models::ScoreOptions& options);

/// ValueModel forward (B, T) float32, sharded when `fsdp` is set.
at::Tensor value_forward(models::ValueModel& model, parallel::FsdpModule* fsdp, const at::Tensor& input_ids,
                         const at::Tensor& attention_mask, const at::Tensor& position_ids);

/// Checkpoint tensors as the engine's named parameters (shared storage).
std::vector<parallel::NamedParameter> named_parameters(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

/// The parameter digest of a model whose parameters may be sharded (gathers them when so).
std::string sharded_parameter_digest(const torch::nn::Module& model, parallel::FsdpModule* fsdp);

}  // namespace hyflow::workers::detail
