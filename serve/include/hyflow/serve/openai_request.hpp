#pragma once
// The bodies of POST /v1/chat/completions and /v1/completions, checked field by field: a wrong
// type, a value out of range or past a limit is an ApiError 400 naming the field. Unknown fields
// are ignored (clients send many); known ones hyflow cannot honour (penalties, logit_bias,
// tool_choice "required") are refused rather than silently dropped.

#include <hyflow/cuda/sampling.hpp>
#include <hyflow/tokenizers/chat_template.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::serve {

/// Bounds on what one request may ask for.
struct RequestLimits {
  size_t max_messages = 256;
  size_t max_tools = 64;
  int64_t max_n = 16;
  size_t max_stop = 4;               ///< stop strings
  size_t max_stop_chars = 64;        ///< bytes of one stop string
  int64_t max_tokens = 1024;         ///< largest max_tokens accepted
  int64_t default_max_tokens = 256;  ///< when the request sets none (cut to what the context leaves)
  size_t max_prompt_tokens = 4096;   ///< token ids of a completion prompt
};

/// What both endpoints share: how many samples, how long, how they are chosen, what comes back.
struct SamplingRequest {
  std::string model;
  int64_t n = 1;
  std::optional<int64_t> max_tokens;
  cuda::SamplingOptions sampling;  ///< temperature 1, top_p 1, top_k -1, min_p 0 unless set
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool logprobs = false;          ///< each completion token's log-prob
  int64_t top_logprobs = 0;       ///< and its k most likely alternatives (chat top_logprobs, completions logprobs: k)
  bool stream = false;            ///< server-sent events
  bool include_usage = false;     ///< stream_options.include_usage: a last chunk with usage
  bool return_token_ids = false;  ///< vLLM's field: prompt_token_ids and each choice's token_ids
  bool ignore_eos = false;        ///< vLLM's field: end tokens do not stop a sample (max_tokens does)
  std::string user;               ///< OpenAI's end-user id; tags the session when no X-Session-Id
};

struct ChatRequest : SamplingRequest {
  std::vector<tokenizers::ChatMessage> messages;
  std::vector<nlohmann::ordered_json> tools;  ///< as sent; rendered by the chat template
  bool tool_choice_none = false;              ///< tool_choice "none": tools not rendered, calls not parsed
};

struct CompletionRequest : SamplingRequest {
  std::optional<std::string> prompt_text;  ///< "prompt": "text"
  std::vector<int64_t> prompt_ids;         ///< "prompt": [ids] (token in)
};

ChatRequest parse_chat_request(const nlohmann::ordered_json& body, const RequestLimits& limits);
CompletionRequest parse_completion_request(const nlohmann::ordered_json& body, const RequestLimits& limits);

}  // namespace hyflow::serve
