#include "choice_state.hpp"

#include <algorithm>
#include <atomic>

namespace hyflow::serve {
namespace {

const std::string kToolCallOpen = "<tool_call>";

// Bytes at the end of s that start a UTF-8 character not yet complete.
size_t incomplete_utf8_tail(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

// The longest suffix of s that is a proper prefix of one of `marks`.
size_t partial_mark_tail(const std::string& s, const std::vector<std::string>& marks) {
  size_t longest = 0;
  for (const auto& m : marks) {
    for (size_t k = std::min(m.size() - 1, s.size()); k > longest; --k) {
      if (s.compare(s.size() - k, k, m, 0, k) == 0) {
        longest = k;
        break;
      }
    }
  }
  return longest;
}

std::atomic<uint64_t> next_call_id{0};

}  // namespace

ChoiceState::ChoiceState(const tokenizers::Tokenizer& tokenizer, std::vector<std::string> stop,
                         std::vector<int64_t> eos, bool parse_tools)
    : tokenizer_(tokenizer), stop_(std::move(stop)), eos_(std::move(eos)), parse_tools_(parse_tools) {
  ids_id_ = "call_" + std::to_string(next_call_id.fetch_add(1)) + "_";
}

void ChoiceState::add(const TokenEvent& event) {
  if (finished_) return;
  tokens_.push_back(event.token);
  log_probs_.push_back(event.log_prob);
  const bool eos = std::find(eos_.begin(), eos_.end(), event.token) != eos_.end();
  std::vector<int64_t> shown(tokens_.begin(), tokens_.end() - (eos ? 1 : 0));
  text_ = tokenizer_.decode(shown, true);
  size_t cut = std::string::npos;
  for (const auto& s : stop_) cut = std::min(cut, text_.find(s));
  if (cut != std::string::npos) {
    text_.resize(cut);
    stopped_ = true;
  }
  finished_ = event.last || stopped_;
  if (finished_ && parse_tools_) parsed_ = parse_tool_calls(text_);
}

std::string ChoiceState::finish_reason() const {
  if (!parsed_.tool_calls.empty()) return "tool_calls";
  if (stopped_) return "stop";
  return !tokens_.empty() && std::find(eos_.begin(), eos_.end(), tokens_.back()) != eos_.end() ? "stop" : "length";
}

nlohmann::ordered_json ChoiceState::message() const {
  nlohmann::ordered_json m{{"role", "assistant"}};
  if (parsed_.tool_calls.empty()) {
    m["content"] = text_;
  } else {
    m["content"] = parsed_.content.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(parsed_.content);
    m["tool_calls"] = tool_calls_json(false);
  }
  return m;
}

nlohmann::ordered_json ChoiceState::tool_calls_json(bool with_index) const {
  auto calls = nlohmann::ordered_json::array();
  for (size_t i = 0; i < parsed_.tool_calls.size(); ++i) {
    nlohmann::ordered_json call;
    if (with_index) call["index"] = i;
    call["id"] = ids_id_ + std::to_string(i);
    call["type"] = "function";
    call["function"] = {{"name", parsed_.tool_calls[i].name}, {"arguments", parsed_.tool_calls[i].arguments}};
    calls.push_back(std::move(call));
  }
  return calls;
}

std::string ChoiceState::streamable() const {
  std::string t = text_;
  if (parse_tools_) {
    const size_t open = t.find(kToolCallOpen);
    if (open != std::string::npos && (!finished_ || !parsed_.tool_calls.empty())) t.resize(open);
  }
  if (finished_) return t;
  auto marks = stop_;
  if (parse_tools_) marks.push_back(kToolCallOpen);
  t.resize(t.size() - partial_mark_tail(t, marks));
  t.resize(t.size() - incomplete_utf8_tail(t));
  return t;
}

std::string ChoiceState::take_delta() {
  const auto now = streamable();
  if (now.size() <= sent_) return {};
  auto delta = now.substr(sent_);
  sent_ = now.size();
  return delta;
}

std::string ChoiceState::piece(int64_t token) const {
  return tokenizer_.decode({token}, false);
}

nlohmann::ordered_json ChoiceState::chat_logprobs(size_t from) const {
  auto content = nlohmann::ordered_json::array();
  for (size_t i = from; i < tokens_.size(); ++i) {
    const auto text = piece(tokens_[i]);
    std::vector<int> bytes(text.begin(), text.end());
    for (auto& b : bytes) b &= 0xFF;
    content.push_back({{"token", text},
                       {"logprob", log_probs_[i]},
                       {"bytes", bytes},
                       {"top_logprobs", nlohmann::ordered_json::array()}});
  }
  return {{"content", content}};
}

nlohmann::ordered_json ChoiceState::completion_logprobs(size_t from) const {
  auto tokens = nlohmann::ordered_json::array(), lps = nlohmann::ordered_json::array();
  auto offsets = nlohmann::ordered_json::array();
  size_t offset = 0;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto text = piece(tokens_[i]);
    if (i >= from) {
      tokens.push_back(text);
      lps.push_back(log_probs_[i]);
      offsets.push_back(offset);
    }
    offset += text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", nullptr}, {"text_offset", offsets}};
}

}  // namespace hyflow::serve
