#pragma once
// One choice of a request as its tokens arrive: the decoded text, stop strings (the text is cut
// before the first match; the ids keep the token that completed it), what may be streamed yet
// (nothing that could still turn out to be a stop string, a tool call or half a UTF-8
// character), tool calls parsed at the end, and the OpenAI JSON of its parts. The text grows by
// decoding only the tokens since the last clean boundary (where the decoded text ended on a whole
// UTF-8 character), so a choice costs time linear in its length, not quadratic.

#include <hyflow/serve/engine_loop.hpp>
#include <hyflow/serve/tool_call_parser.hpp>
#include <hyflow/tokenizers/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace hyflow::serve {

class ChoiceState {
 public:
  ChoiceState(const tokenizers::Tokenizer& tokenizer, std::vector<std::string> stop, std::vector<int64_t> eos,
              bool parse_tools);

  /// Adds a token of this choice; ignored once the choice finished (the engine may run one more step).
  void add(const TokenEvent& event);
  bool finished() const { return finished_; }
  const std::vector<int64_t>& tokens() const { return tokens_; }
  const std::vector<float>& log_probs() const { return log_probs_; }
  /// The weight version of each token (they differ after a partial weight update).
  const std::vector<int64_t>& weight_versions() const { return versions_; }
  /// The text so far (cut before a stop string): a completion's text.
  const std::string& text() const { return text_; }
  /// "stop" (end token or stop string), "length", "tool_calls".
  std::string finish_reason() const;
  /// The assistant message: content (null when the output is only tool calls) and tool_calls.
  nlohmann::ordered_json message() const;
  const std::vector<ParsedToolCall>& tool_calls() const { return parsed_.tool_calls; }
  /// OpenAI's tool_calls array (with "index" for stream deltas).
  nlohmann::ordered_json tool_calls_json(bool with_index) const;
  /// The text that may be streamed now and was not yet.
  std::string take_delta();
  bool end_sent() const { return end_sent_; }
  void mark_end_sent() { end_sent_ = true; }
  bool role_sent() const { return role_sent_; }
  void mark_role_sent() { role_sent_ = true; }
  /// Log-probs of tokens [from, end) as chat ({"content": [...]}) and completion (tokens, token_logprobs)
  /// objects, with each token's top_logprobs alternatives (the completion's are null when none were asked).
  nlohmann::ordered_json chat_logprobs(size_t from) const;
  nlohmann::ordered_json completion_logprobs(size_t from, bool with_top) const;

 private:
  size_t streamable_size() const;
  std::string piece(int64_t token) const;

  const tokenizers::Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  std::vector<int64_t> eos_;
  bool parse_tools_;
  std::vector<int64_t> tokens_;
  std::vector<float> log_probs_;
  std::vector<int64_t> versions_;
  std::vector<std::vector<inference::TokenLogProb>> tops_;
  mutable std::vector<size_t> offsets_;  // text_offset of each token's piece, extended as asked
  std::string text_;
  std::vector<int64_t> window_;  // tokens after the last clean boundary, decoded anew per token
  size_t clean_ = 0;             // text_[0, clean_) is final: the decoding of the tokens before window_
  size_t longest_stop_ = 0;
  bool finished_ = false, stopped_ = false, end_sent_ = false, role_sent_ = false;
  size_t sent_ = 0;
  ParsedOutput parsed_;
  std::string ids_id_;  // call id prefix
};

}  // namespace hyflow::serve
