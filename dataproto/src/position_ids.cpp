#include <hyflow/dataproto/position_ids.hpp>

#include <ATen/ATen.h>

namespace hyflow::dataproto {

at::Tensor position_ids_from_mask(const at::Tensor& attention_mask) {
  return (attention_mask.to(at::kLong).cumsum(-1) - 1).clamp_min(0);
}

}  // namespace hyflow::dataproto
