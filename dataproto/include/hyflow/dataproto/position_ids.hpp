#pragma once
// verl's position ids of a padded batch (verl.utils.model.compute_position_id_with_mask): every
// real token counts from 0, padding takes 0. Tokenizers build prompts with it, the models use it
// when a forward is given no position ids.

#include <ATen/core/Tensor.h>

namespace hyflow::dataproto {

/// clip(cumsum(mask, -1) - 1, 0) as int64, for an attention mask (B, S) of 1 (token) and 0 (padding).
at::Tensor position_ids_from_mask(const at::Tensor& attention_mask);

}  // namespace hyflow::dataproto

namespace hyflow {
using dataproto::position_ids_from_mask;
}  // namespace hyflow
