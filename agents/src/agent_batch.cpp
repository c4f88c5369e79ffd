#include <hyflow/agents/agent_batch.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/position_ids.hpp>

#include <torch/torch.h>

namespace hyflow::agents {

DataProto agent_outputs_to_batch(const std::vector<AgentLoopOutput>& outputs, int64_t prompt_length,
                                 int64_t response_length, int64_t pad_id) {
  const auto B = static_cast<int64_t>(outputs.size());
  const int64_t P = prompt_length, R = response_length;
  auto prompts = torch::full({B, P}, pad_id, torch::kLong);
  auto prompt_mask = torch::zeros({B, P}, torch::kLong);
  auto responses = torch::full({B, R}, pad_id, torch::kLong);
  auto response_attn = torch::zeros({B, R}, torch::kLong);
  auto response_mask = torch::zeros({B, R}, torch::kLong);
  auto log_probs = torch::zeros({B, R}, torch::kFloat);
  auto p = prompts.accessor<int64_t, 2>();
  auto pm = prompt_mask.accessor<int64_t, 2>();
  auto r = responses.accessor<int64_t, 2>();
  auto ra = response_attn.accessor<int64_t, 2>();
  auto rm = response_mask.accessor<int64_t, 2>();
  auto lp = log_probs.accessor<float, 2>();
  dataproto::Column turns, scores, metrics;
  for (int64_t i = 0; i < B; ++i) {
    const auto& o = outputs[static_cast<size_t>(i)];
    const auto np = static_cast<int64_t>(o.prompt_ids.size()), nr = static_cast<int64_t>(o.response_ids.size());
    if (np > P)
      throw ValueError("agent sample " + std::to_string(i) + ": the prompt has " + std::to_string(np) +
                       " ids, more than the prompt length " + std::to_string(P));
    if (nr > R)
      throw ValueError("agent sample " + std::to_string(i) + ": the response has " + std::to_string(nr) +
                       " ids, more than the response length " + std::to_string(R));
    if (o.response_mask.size() != o.response_ids.size() || o.response_log_probs.size() != o.response_ids.size())
      throw ValueError("agent sample " + std::to_string(i) + ": response ids, mask and log-probs differ in length");
    for (int64_t j = 0; j < np; ++j) {
      p[i][P - np + j] = o.prompt_ids[static_cast<size_t>(j)];
      pm[i][P - np + j] = 1;
    }
    for (int64_t j = 0; j < nr; ++j) {
      const auto k = static_cast<size_t>(j);
      r[i][j] = o.response_ids[k];
      ra[i][j] = 1;
      rm[i][j] = o.response_mask[k];
      lp[i][j] = o.response_mask[k] != 0 ? o.response_log_probs[k] : 0.0F;
    }
    turns.emplace_back(o.num_turns);
    scores.push_back(o.reward_scores);
    metrics.push_back(o.metrics);
  }
  auto attention_mask = torch::cat({prompt_mask, response_attn}, 1);
  dataproto::NonTensorBatch non_tensor;
  non_tensor["__num_turns__"] = std::move(turns);
  non_tensor["reward_scores"] = std::move(scores);
  non_tensor["agent_metrics"] = std::move(metrics);
  return DataProto(TensorDict{{"prompts", prompts},
                              {"responses", responses},
                              {"response_mask", response_mask},
                              {"input_ids", torch::cat({prompts, responses}, 1)},
                              {"attention_mask", attention_mask},
                              {"position_ids", dataproto::position_ids_from_mask(attention_mask)},
                              {"rollout_log_probs", log_probs}},
                   std::move(non_tensor));
}

}  // namespace hyflow::agents
