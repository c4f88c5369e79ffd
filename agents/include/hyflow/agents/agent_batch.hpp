#pragma once
// Agent-loop outputs as verl's rollout batch (what generate_sequences returns), ready for the
// trainer: the response mask marks the model's own ids, the attention mask every real id.

#include <hyflow/agents/agent_loop.hpp>
#include <hyflow/dataproto/data_proto.hpp>

#include <cstdint>
#include <vector>

namespace hyflow::agents {

/// prompts (B, P) left-padded with pad_id, responses (B, R) right-padded, response_mask (B, R)
/// (the loops' masks, 0 on padding), rollout_log_probs (B, R) (0 where the mask is 0),
/// input_ids, attention_mask (1 on every prompt and response id, tool turns included) and
/// position_ids (verl's clip(cumsum(mask) - 1, 0)) (B, P+R), and the non-tensor columns
/// __num_turns__, reward_scores and agent_metrics (each sample's AgentLoopOutput::metrics; rows
/// travel through data-parallel dispatch, agent_batch_metrics sums them up). A prompt
/// longer than P or a response longer than R is a ValueError naming the sample.
DataProto agent_outputs_to_batch(const std::vector<AgentLoopOutput>& outputs, int64_t prompt_length,
                                 int64_t response_length, int64_t pad_id);

}  // namespace hyflow::agents
