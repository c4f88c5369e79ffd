#include "choice_state.hpp"

#include <algorithm>
#include <atomic>
#include <string_view>

namespace hyflow::serve {
namespace {

const std::string kToolCallOpen = "<tool_call>";

// Bytes at the end of s that start a UTF-8 character not yet complete.
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

// The longest suffix of s that is a proper prefix of one of `marks`.
size_t partial_mark_tail(std::string_view s, const std::vector<std::string>& marks) {
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
  for (const auto& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
}

void ChoiceState::add(const TokenEvent& event) {
  if (finished_) return;
  tokens_.push_back(event.token);
  log_probs_.push_back(event.log_prob);
  versions_.push_back(event.weight_version);
  tops_.push_back(event.top);
  const bool eos = std::find(eos_.begin(), eos_.end(), event.token) != eos_.end();
  // Text before clean_ cannot change, so a stop string not found in it before is searched for
  // only from where it could start now.
  const size_t search_from = clean_ >= longest_stop_ ? clean_ - longest_stop_ + 1 : 0;
  if (!eos) {
    window_.push_back(event.token);
    text_.resize(clean_);
    text_ += tokenizer_.decode(window_, true);
    // Clean: the window's text ends on a whole character (a byte-level BPE decode shows a
    // character cut by the token boundary as U+FFFD, a raw decode as an incomplete sequence).
    static const std::string kReplacement = "\xEF\xBF\xBD";
    const bool cut_char = incomplete_utf8_tail(text_) > 0 ||
                          (text_.size() - clean_ >= kReplacement.size() &&
                           text_.compare(text_.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0);
    if (!cut_char) {
      clean_ = text_.size();
      window_.clear();
    }
  }
  size_t cut = std::string::npos;
  for (const auto& s : stop_) cut = std::min(cut, text_.find(s, search_from));
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

size_t ChoiceState::streamable_size() const {
  // Nothing at or after a tool call's start was streamed (its prefix was held back), so the
  // search starts at what was sent.
  std::string_view t = text_;
  if (!finished_) t = t.substr(0, clean_);  // the tokens after clean_ may end inside a character
  if (parse_tools_) {
    const size_t open = text_.find(kToolCallOpen, sent_);
    if (open != std::string::npos && (!finished_ || !parsed_.tool_calls.empty())) t = t.substr(0, open);
  }
  if (finished_) return t.size();
  auto marks = stop_;
  if (parse_tools_) marks.push_back(kToolCallOpen);
  t = t.substr(0, t.size() - partial_mark_tail(t, marks));
  return t.size() - incomplete_utf8_tail(t);
}

std::string ChoiceState::take_delta() {
  const size_t now = streamable_size();
  if (now <= sent_) return {};
  auto delta = text_.substr(sent_, now - sent_);
  sent_ = now;
  return delta;
}

std::string ChoiceState::piece(int64_t token) const {
  return tokenizer_.decode({token}, false);
}

nlohmann::ordered_json ChoiceState::chat_logprobs(size_t from) const {
  auto entry = [&](int64_t token, float log_prob) {
    const auto text = piece(token);
    std::vector<int> bytes(text.begin(), text.end());
    for (auto& b : bytes) b &= 0xFF;
    return nlohmann::ordered_json{{"token", text}, {"logprob", log_prob}, {"bytes", bytes}};
  };
  auto content = nlohmann::ordered_json::array();
  for (size_t i = from; i < tokens_.size(); ++i) {
    auto e = entry(tokens_[i], log_probs_[i]);
    auto top = nlohmann::ordered_json::array();
    for (const auto& alt : tops_[i]) top.push_back(entry(alt.token, alt.log_prob));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", content}};
}

nlohmann::ordered_json ChoiceState::completion_logprobs(size_t from, bool with_top) const {
  auto tokens = nlohmann::ordered_json::array(), lps = nlohmann::ordered_json::array();
  auto offsets = nlohmann::ordered_json::array(), tops = nlohmann::ordered_json::array();
  // Each token's text offset is the sum of the pieces before it, computed once per token.
  for (size_t i = offsets_.size(); i < tokens_.size(); ++i) {
    offsets_.push_back(i == 0 ? 0 : offsets_[i - 1] + piece(tokens_[i - 1]).size());
  }
  for (size_t i = from; i < tokens_.size(); ++i) {
    tokens.push_back(piece(tokens_[i]));
    lps.push_back(log_probs_[i]);
    offsets.push_back(offsets_[i]);
    // OpenAI's legacy shape: {token text: log-prob} (alternatives with the same text keep the likelier).
    auto top = nlohmann::ordered_json::object();
    for (const auto& alt : tops_[i]) {
      const auto alt_text = piece(alt.token);
      if (!top.contains(alt_text)) top[alt_text] = alt.log_prob;
    }
    tops.push_back(std::move(top));
  }
  return {{"tokens", tokens},
          {"token_logprobs", lps},
          {"top_logprobs", with_top ? tops : nlohmann::ordered_json(nullptr)},
          {"text_offset", offsets}};
}

}  // namespace hyflow::serve
