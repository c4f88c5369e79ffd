#include <hyflow/models/inference_context.hpp>

#include <hyflow/cuda/linear.hpp>
#include <hyflow/models/config.hpp>

namespace hyflow::models {

InferenceContext::InferenceContext(const ModelConfig& config, int64_t batch_size, int64_t capacity,
                                   at::TensorOptions options)
    : cache_(config, batch_size, capacity, options) {}

const at::Tensor& InferenceContext::packed_weight(const at::Tensor& weight) {
  const void* key = weight.unsafeGetTensorImpl();
  auto it = packed_.find(key);
  if (it == packed_.end()) it = packed_.emplace(key, cuda::pack_onednn_weight(weight)).first;
  return it->second;
}

}  // namespace hyflow::models
