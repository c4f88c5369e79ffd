#include <hyflow/tokenizers/tokenizer.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/position_ids.hpp>

#include <torch/torch.h>

namespace hyflow::tokenizers {

DataProto encode_prompts(const Tokenizer& tokenizer, const std::vector<std::string>& texts,
                         std::optional<int64_t> max_length) {
  if (texts.empty()) throw ValueError("encode_prompts: no texts");
  std::vector<std::vector<int64_t>> encoded;
  int64_t longest = 0;
  for (const auto& t : texts) {
    encoded.push_back(tokenizer.encode(t));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(encoded.back().size()));
  }
  const int64_t P = max_length.value_or(longest);
  if (P < longest || P <= 0) {
    throw ValueError("encode_prompts: a prompt has " + std::to_string(longest) + " tokens, max_length is " +
                     std::to_string(P));
  }
  const auto B = static_cast<int64_t>(texts.size());
  auto ids = torch::full({B, P}, tokenizer.pad_token_id(), torch::kLong);
  auto mask = torch::zeros({B, P}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const auto& row = encoded[static_cast<size_t>(b)];
    const auto len = static_cast<int64_t>(row.size());
    if (len == 0) continue;
    ids[b].narrow(0, P - len, len).copy_(torch::tensor(row, torch::kLong));
    mask[b].narrow(0, P - len, len).fill_(1);
  }
  return DataProto(
      TensorDict{{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", position_ids_from_mask(mask)}});
}

}  // namespace hyflow::tokenizers
