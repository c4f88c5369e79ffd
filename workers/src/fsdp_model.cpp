#include "fsdp_model.hpp"

#include <hyflow/dataproto/position_ids.hpp>
#include <hyflow/parallel/data_parallel.hpp>

#include <torch/torch.h>

namespace hyflow::workers::detail {

std::shared_ptr<parallel::FsdpModule> shard_model(torch::nn::Module& model,
                                                  const std::shared_ptr<parallel::ProcessGroup>& group,
                                                  const FsdpSection& config, const std::string& tag,
                                                  const std::string& path) {
  // Offload moves the sharded engine's shards (param_offload) and AdamW moments
  // (optimizer_offload) to host memory between uses; on a CPU worker they are there already (a
  // no-op, said once). The replicated path (one rank, or fsdp_size 1 in fp32) has no offload:
  // a GPU model refuses the keys there rather than ignoring them.
  const auto tensors = model.parameters();
  const bool on_gpu = !tensors.empty() && !tensors.front().device().is_cpu();
  const auto refuse_or_note = [&] {
    for (const auto& [set, key] :
         {std::pair{config.param_offload, "param_offload"}, std::pair{config.optimizer_offload, "optimizer_offload"}}) {
      if (!set) continue;
      if (on_gpu)
        throw ValueError("config key '" + path + "." + key +
                         "': offload needs the sharded engine; this role's model on " + tensors.front().device().str() +
                         " is replicated (one rank, or fsdp_size 1 in fp32)");
      parallel::note_offload_noop(std::string("fsdp_config.") + key);
    }
  };
  // Precision first, so that a wrong value names its key on one rank too. Mixed precision needs
  // the engine (it holds the float32 masters), also on a single rank: a replicated FsdpModule.
  const parallel::MixedPrecision precision{
      .param_dtype = parallel::parse_dtype(config.param_dtype, path + ".mixed_precision.param_dtype"),
      .reduce_dtype = parallel::parse_dtype(config.reduce_dtype, path + ".mixed_precision.reduce_dtype"),
      .buffer_dtype = parallel::parse_dtype(config.buffer_dtype, path + ".mixed_precision.buffer_dtype")};
  parallel::cast_buffers(model, precision.buffer_dtype);
  const bool full_precision = precision.param_dtype == at::kFloat && precision.reduce_dtype == at::kFloat;
  auto mesh = group ? parallel::make_device_mesh(group, config.fsdp_size, tag) : parallel::DeviceMesh{};
  if (mesh.shard_size() == 1 && full_precision) {
    refuse_or_note();
    return nullptr;
  }
  std::vector<parallel::NamedParameter> params;
  for (const auto& item : model.named_parameters()) params.push_back({item.key(), item.value()});
  return std::make_shared<parallel::FsdpModule>(
      parallel::units_by_layer(params, config.min_num_params), std::move(mesh),
      parallel::FsdpOptions{.reshard_after_forward = config.reshard_after_forward,
                            .mixed_precision = precision,
                            .param_offload = config.param_offload,
                            .optimizer_offload = config.optimizer_offload});
}

at::Tensor sharded_hidden_states(models::TransformerImpl& transformer, const models::ModelConfig& config,
                                 parallel::FsdpModule& fsdp, const at::Tensor& input_ids,
                                 const at::Tensor& attention_mask, const at::Tensor& position_ids) {
  static const std::string layer_prefix = "model.layers.";  // the units of a CausalLM and a ValueModel
  // The steps of TransformerImpl::forward for a pass without cache (past = 0).
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  auto mask = attention_mask.defined() ? attention_mask.to(at::kBool)
                                       : torch::ones({B, T}, input_ids.options().dtype(at::kBool));
  if (mask.dim() != 2 || mask.size(0) != B || mask.size(1) != T)
    throw ShapeError("sharded forward: attention_mask must be (B, T) = (" + std::to_string(B) + ", " +
                     std::to_string(T) + ")");
  auto positions = position_ids.defined() ? position_ids : dataproto::position_ids_from_mask(mask);
  auto query_pos = torch::arange(0, T, input_ids.options().dtype(at::kLong)).view({T, 1});
  auto key_pos = torch::arange(0, T, input_ids.options().dtype(at::kLong)).view({1, T});
  auto blocked = (key_pos > query_pos).view({1, 1, T, T}).logical_or(mask.logical_not().view({B, 1, 1, T}));

  fsdp.begin_forward();
  auto h = transformer.embed_tokens(input_ids);  // (B, T, d)
  const models::RotaryEmbedding rotary(config.resolved_head_dim(), config.rope_theta, config.rope_scaling);
  auto [cos, sin] = rotary.cos_sin(positions, h.scalar_type());
  for (int64_t i = 0; i < static_cast<int64_t>(transformer.layers->size()); ++i) {
    auto* layer = transformer.layers[static_cast<size_t>(i)]->as<models::DecoderLayerImpl>();
    const int unit = fsdp.find_unit(layer_prefix + std::to_string(i));
    if (unit < 0) {  // below wrap_policy.min_num_params: part of the root unit
      h = layer->forward(h, cos, sin, blocked, nullptr, i);
      continue;
    }
    h = fsdp.enter_unit(unit, h);
    h = layer->forward(h, cos, sin, blocked, nullptr, i);
    h = fsdp.exit_unit(unit, h);
  }
  return transformer.norm(h);
}

models::ResponseScores response_scores(models::CausalLM& model, parallel::FsdpModule* fsdp, const DataProto& batch,
                                       const models::ScoreOptions& options) {
  if (!fsdp) return models::compute_response_scores(model, batch, options);
  const auto& mask = batch.batch.at("attention_mask");
  auto positions =
      batch.batch.contains("position_ids") ? batch.batch.at("position_ids") : dataproto::position_ids_from_mask(mask);
  auto hidden =
      sharded_hidden_states(*model->model, model->config(), *fsdp, batch.batch.at("input_ids"), mask, positions);
  // the head through the engine: its backward frees the (tied) weight before forming its gradient
  const auto& weight = model->lm_head ? model->lm_head->weight : model->model->embed_tokens->weight;
  auto logits = fsdp->head(hidden, weight, [&model](const at::Tensor& x) { return model->logits(x); });
  auto scores = models::response_scores_from_logits(logits, batch.batch.at("responses"), options);
  if (!torch::GradMode::is_enabled()) fsdp->end_forward();
  return scores;
}

at::Tensor value_forward(models::ValueModel& model, parallel::FsdpModule* fsdp, const at::Tensor& input_ids,
                         const at::Tensor& attention_mask, const at::Tensor& position_ids) {
  if (!fsdp) return model(input_ids, attention_mask, position_ids);
  auto hidden = sharded_hidden_states(*model->model, model->config(), *fsdp, input_ids, attention_mask, position_ids);
  auto values = model->score(hidden).squeeze(-1).to(at::kFloat);  // as ValueModelImpl::forward
  if (!torch::GradMode::is_enabled()) fsdp->end_forward();
  return values;
}

std::vector<parallel::NamedParameter> named_parameters(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<parallel::NamedParameter> out;
  for (const auto& [name, t] : tensors) out.push_back({name, t});
  return out;
}

std::string sharded_parameter_digest(const torch::nn::Module& model, parallel::FsdpModule* fsdp) {
  if (fsdp) fsdp->unshard_all();
  auto digest = parallel::parameter_digest(model.parameters());
  if (fsdp) fsdp->reshard_all();
  return digest;
}

}  // namespace hyflow::workers::detail
