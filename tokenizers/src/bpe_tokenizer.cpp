#include <hyflow/tokenizers/bpe_tokenizer.hpp>

#include <hyflow/core/error.hpp>

#include "normalizer.hpp"
#include "unicode_classes.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <mutex>
#include <queue>
#include <shared_mutex>

namespace hyflow::tokenizers {
namespace {

using Json = nlohmann::json;
using unicode::Codepoint;

// The two split patterns of the byte-level BPE families we read. They differ only in how
// many digits one piece may hold.
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's reversible byte -> printable character map: bytes that are printable keep their
// code point, the others get 256, 257, ... in byte order.
struct ByteMap {
  std::array<std::string, 256> encode;  // byte -> UTF-8 of its character
  std::array<int, 0x200> decode;        // character -> byte (-1: not a byte character)
  ByteMap() {
    decode.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      unicode::append_utf8(encode[static_cast<size_t>(b)], cp);
      decode[cp] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

// The regex's (?i:...) compares case-folded characters: U+017F (long s) matches 's'.
char32_t fold(char32_t c) {
  return unicode::simple_fold(c);
}
bool is_newline(char32_t c) {
  return c == '\r' || c == '\n';
}
bool is_other(char32_t c) {
  return !unicode::is_space(c) && !unicode::is_letter(c) && !unicode::is_number(c);
}

// Length (in code points) of the regex match at i; the alternatives in pattern order.
size_t match_at(const std::vector<Codepoint>& cps, size_t i, int64_t max_digits) {
  const size_t n = cps.size();
  auto cp = [&](size_t k) { return cps[k].value; };
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (cp(i) == '\'' && i + 1 < n) {
    const char32_t a = fold(cp(i + 1));
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 < n) {
      const char32_t b = fold(cp(i + 2));
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    if (!unicode::is_letter(cp(j)) && !is_newline(cp(j)) && !unicode::is_number(cp(j)) && j + 1 < n &&
        unicode::is_letter(cp(j + 1))) {
      ++j;
    }
    if (unicode::is_letter(cp(j))) {
      while (j < n && unicode::is_letter(cp(j))) ++j;
      return j - i;
    }
  }
  // \p{N}{1,max_digits}
  if (unicode::is_number(cp(i))) {
    size_t j = i;
    while (j < n && unicode::is_number(cp(j)) && static_cast<int64_t>(j - i) < max_digits) ++j;
    return j - i;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  {
    size_t j = (cp(i) == ' ' && i + 1 < n) ? i + 1 : i;
    if (is_other(cp(j))) {
      while (j < n && is_other(cp(j))) ++j;
      while (j < n && is_newline(cp(j))) ++j;
      return j - i;
    }
  }
  // The whitespace run [i, end)
  size_t end = i;
  while (end < n && unicode::is_space(cp(end))) ++end;
  // \s*[\r\n]+ : up to and including the run's last newline
  for (size_t k = end; k > i; --k) {
    if (is_newline(cp(k - 1))) return k - i;
  }
  // \s+(?!\S) : the run, minus its last space when a non-space follows
  if (end == n) return end - i;
  if (end - i >= 2) return end - 1 - i;
  // \s+
  return end - i;
}

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw FormatError(file.string() + ": cannot open");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

BpeTokenizer BpeTokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  Json j;
  try {
    j = Json::parse(read_text(tokenizer_json));
  } catch (const Json::exception& e) {
    throw FormatError(tokenizer_json.string() + ": invalid JSON: " + e.what());
  }
  BpeTokenizer tok(j, tokenizer_json.string());
  const auto config_path = tokenizer_json.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    Json c;
    try {
      c = Json::parse(read_text(config_path));
    } catch (const Json::exception& e) {
      throw FormatError(config_path.string() + ": invalid JSON: " + e.what());
    }
    auto token_field = [&](const char* key) -> std::optional<std::string> {
      if (!c.contains(key) || c[key].is_null()) return std::nullopt;
      if (c[key].is_string()) return c[key].get<std::string>();
      if (c[key].is_object() && c[key].contains("content")) return c[key]["content"].get<std::string>();
      throw FormatError(config_path.string() + ": '" + key + "' must be a string or an AddedToken");
    };
    if (auto eos = token_field("eos_token")) tok.set_eos_token(*eos);
    if (auto pad = token_field("pad_token")) tok.set_pad_token(*pad);
  }
  return tok;
}

BpeTokenizer::BpeTokenizer(const Json& j, const std::string& source) {
  auto fail = [&](const std::string& what) { throw FormatError(source + ": " + what); };
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) fail("missing object 'model'");
  const auto& model = j["model"];
  if (model.value("type", "") != "BPE") fail("model.type must be \"BPE\"");
  if (!model.contains("vocab") || !model["vocab"].is_object()) fail("missing object 'model.vocab'");
  if (!model.contains("merges") || !model["merges"].is_array()) fail("missing array 'model.merges'");
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty())) {
      fail(std::string("model.") + key + " is not supported (null only)");
    }
  }
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>()) {
    fail("model.byte_fallback is not supported (byte-level BPE only)");
  }
  ignore_merges_ =
      model.contains("ignore_merges") && model["ignore_merges"].is_boolean() && model["ignore_merges"].get<bool>();

  auto add_token = [&](const std::string& token, int64_t id) {
    if (id < 0 || id > (int64_t{1} << 31)) fail("token '" + token + "' has invalid id " + std::to_string(id));
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(static_cast<size_t>(id) + 1);
    id_to_token_[static_cast<size_t>(id)] = token;
    token_to_id_.insert_or_assign(token, id);
  };
  const size_t n_added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"].size() : 0;
  token_to_id_.reserve(model["vocab"].size() + n_added);
  id_to_token_.reserve(model["vocab"].size() + n_added);
  merges_.reserve(model["merges"].size());
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) fail("model.vocab['" + token + "'] is not an integer");
    add_token(token, id.get<int64_t>());
  }

  int64_t rank = 0;
  std::string left, right, joined;
  for (const auto& m : model["merges"]) {
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      const auto space = s.find(' ');
      if (space == std::string::npos) fail("merge " + std::to_string(rank) + " '" + s + "' has no space");
      left.assign(s, 0, space);
      right.assign(s, space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get_ref<const std::string&>();
      right = m[1].get_ref<const std::string&>();
    } else {
      fail("merge " + std::to_string(rank) + " must be \"a b\" or [a, b]");
    }
    joined.assign(left).append(right);
    auto l = token_to_id_.find(left), r = token_to_id_.find(right), merged = token_to_id_.find(joined);
    if (l == token_to_id_.end() || r == token_to_id_.end() || merged == token_to_id_.end()) {
      fail("merge " + std::to_string(rank) + " ('" + left + "', '" + right + "') uses tokens missing from the vocab");
    }
    const uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint64_t>(r->second);
    merges_.insert_or_assign(key, Merge{rank, merged->second});  // a repeated pair: the last rank, like the reference
    ++rank;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = token_to_id_.find(byte_map().encode[static_cast<size_t>(b)]);
    if (it == token_to_id_.end()) fail("the vocab lacks the byte-level token for byte " + std::to_string(b));
    byte_ids_[static_cast<size_t>(b)] = it->second;
  }

  // Normalizer: applied between the added tokens whose `normalized` is false.
  normalizer_ = std::make_shared<const Normalizer>(j.contains("normalizer") ? j["normalizer"] : Json(), source);

  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || !t.contains("id") ||
          !t["id"].is_number_integer()) {
        fail("added_tokens entries need a string 'content' and an integer 'id'");
      }
      const bool special = t.value("special", false);
      AddedToken a{
          t["content"].get<std::string>(), {}, t["id"].get<int64_t>(), special, t.value("normalized", !special)};
      if (a.content.empty()) fail("added token " + std::to_string(a.id) + " is empty");
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (t.value(flag, false)) {
          fail("added token '" + a.content + "': '" + flag + "' = true is not supported");
        }
      }
      a.pattern = a.normalized ? normalizer_->normalize(a.content) : a.content;
      add_token(a.content, a.id);
      added_.push_back(std::move(a));  // one normalized to nothing is never matched
    }
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.pattern.size() > b.pattern.size(); });
  for (size_t i = 0; i < added_.size(); ++i) added_by_id_[added_[i].id] = i;

  // Pre-tokenizer: Sequence[Split(pattern, Isolated), ByteLevel(use_regex = false)].
  const auto& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : Json();
  bool ok = pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
            pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2;
  if (ok) {
    const auto& split = pre["pretokenizers"][0];
    const auto& bytes = pre["pretokenizers"][1];
    const auto pattern = split.contains("pattern") && split["pattern"].contains("Regex")
                             ? split["pattern"]["Regex"].get<std::string>()
                             : std::string();
    ok = split.value("type", "") == "Split" && split.value("behavior", "") == "Isolated" &&
         !split.value("invert", false) && bytes.value("type", "") == "ByteLevel" && !bytes.value("use_regex", true) &&
         !bytes.value("add_prefix_space", false);
    if (ok && pattern == kQwen2Pattern) {
      max_digits_ = 1;
    } else if (ok && pattern == kLlama3Pattern) {
      max_digits_ = 3;
    } else {
      ok = false;
    }
  }
  if (!ok) fail("pre_tokenizer is not the Qwen2 / Llama 3 byte-level split (Sequence[Split, ByteLevel])");
  if (j.contains("decoder") && !j["decoder"].is_null() && j["decoder"].value("type", "") != "ByteLevel") {
    fail("decoder '" + j["decoder"].value("type", "") + "' is not supported (ByteLevel)");
  }
  if (auto eos = token_to_id("<|endoftext|>")) eos_id_ = pad_id_ = *eos;
  cache_ = std::make_shared<WordCache>();
}

std::optional<int64_t> BpeTokenizer::token_to_id(std::string_view token) const {
  auto it = token_to_id_.find(std::string(token));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeTokenizer::set_eos_token(std::string_view token) {
  auto id = token_to_id(token);
  if (!id) throw KeyError("BpeTokenizer: eos token '" + std::string(token) + "' is not in the vocab");
  eos_id_ = *id;
}

void BpeTokenizer::set_pad_token(std::string_view token) {
  auto id = token_to_id(token);
  if (!id) throw KeyError("BpeTokenizer: pad token '" + std::string(token) + "' is not in the vocab");
  pad_id_ = *id;
}

std::vector<std::string> BpeTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  const auto cps = unicode::decode_utf8(text);
  for (size_t i = 0; i < cps.size();) {
    const size_t len = match_at(cps, i, max_digits_);
    const size_t begin = cps[i].begin, end = cps[i + len - 1].end;
    pieces.emplace_back(text.substr(begin, end - begin));
    i += len;
  }
  return pieces;
}

std::string BpeTokenizer::normalize(std::string_view text) const {
  return normalizer_->normalize(text);
}

// Words (byte-level pieces) already merged, like the tokenizers library's BPE cache: at most
// kCapacity words of at most kMaxWordBytes bytes; when full, new words are not cached.
struct BpeTokenizer::WordCache {
  static constexpr size_t kCapacity = 10000, kMaxWordBytes = 256;
  std::shared_mutex mutex;
  std::unordered_map<std::string, std::vector<int64_t>> words;
};

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int64_t>& out) const {
  if (ignore_merges_) {
    std::string mapped;
    for (unsigned char b : piece) mapped += byte_map().encode[b];
    if (auto it = token_to_id_.find(mapped); it != token_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > WordCache::kMaxWordBytes) {
    bpe(piece, out);
    return;
  }
  const std::string key(piece);
  {
    std::shared_lock lock(cache_->mutex);
    if (auto it = cache_->words.find(key); it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bpe(piece, out);
  std::unique_lock lock(cache_->mutex);
  if (cache_->words.size() < WordCache::kCapacity) {
    cache_->words.try_emplace(key, out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  }
}

// Merges the lowest-ranked adjacent pair (leftmost on ties) until none is left, in O(n log n):
// the symbols form a linked list and the candidate pairs a min-heap on (rank, position);
// entries whose pair changed since they were pushed are skipped when popped.
void BpeTokenizer::bpe(std::string_view piece, std::vector<int64_t>& out) const {
  const size_t n = piece.size();
  struct Symbol {
    int64_t id;
    size_t prev, next;  // n: none
    bool alive;
  };
  std::vector<Symbol> symbols(n);
  for (size_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<unsigned char>(piece[i])], i == 0 ? n : i - 1, i + 1, true};
  }
  struct Candidate {
    int64_t rank;
    size_t pos;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto merge_at = [&](size_t pos) -> const Merge* {
    const size_t next = symbols[pos].next;
    if (next >= n) return nullptr;
    const uint64_t key = (static_cast<uint64_t>(symbols[pos].id) << 32) | static_cast<uint64_t>(symbols[next].id);
    auto it = merges_.find(key);
    return it == merges_.end() ? nullptr : &it->second;
  };
  auto push = [&](size_t pos) {
    if (const Merge* m = merge_at(pos)) heap.push({m->rank, pos});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    if (!symbols[top.pos].alive) continue;
    const Merge* m = merge_at(top.pos);
    if (m == nullptr || m->rank != top.rank) continue;  // stale: the pair changed
    Symbol& left = symbols[top.pos];
    Symbol& right = symbols[left.next];
    left.id = m->merged_id;
    right.alive = false;
    left.next = right.next;
    if (left.next < n) symbols[left.next].prev = top.pos;
    if (left.prev < n) push(left.prev);
    push(top.pos);
  }
  for (size_t i = 0; i < n; i = symbols[i].next) out.push_back(symbols[i].id);
}

template <typename OnText, typename OnToken>
void BpeTokenizer::split_added(std::string_view text, bool normalized, OnText&& on_text, OnToken&& on_token) const {
  std::array<bool, 256> first_byte{};
  bool any = false;
  for (const auto& a : added_) {
    if (a.normalized == normalized && !a.pattern.empty()) {
      first_byte[static_cast<unsigned char>(a.pattern[0])] = any = true;
    }
  }
  size_t plain_start = 0;
  for (size_t pos = 0; any && pos < text.size(); ++pos) {
    if (!first_byte[static_cast<unsigned char>(text[pos])]) continue;
    const AddedToken* hit = nullptr;
    for (const auto& a : added_) {  // longest first: the leftmost longest match
      if (a.normalized == normalized && !a.pattern.empty() && text.compare(pos, a.pattern.size(), a.pattern) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) continue;
    if (pos > plain_start) on_text(text.substr(plain_start, pos - plain_start));
    on_token(hit->id);
    plain_start = pos + hit->pattern.size();
    pos = plain_start - 1;
  }
  if (plain_start < text.size()) on_text(text.substr(plain_start));
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int64_t>& out) const {
  for (const auto& piece : pre_tokenize(text)) encode_piece(piece, out);
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  auto on_token = [&](int64_t id) { ids.push_back(id); };
  split_added(
      text, /*normalized=*/false,
      [&](std::string_view part) {
        if (normalizer_->empty()) {
          split_added(
              part, true, [&](std::string_view rest) { encode_text(rest, ids); }, on_token);
          return;
        }
        const std::string normalized = normalizer_->normalize(part);
        split_added(
            normalized, true, [&](std::string_view rest) { encode_text(rest, ids); }, on_token);
      },
      on_token);
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size() || id_to_token_[static_cast<size_t>(id)].empty()) {
      throw ValueError("BpeTokenizer: unknown token id " + std::to_string(id));
    }
    if (auto it = added_by_id_.find(id);
        it != added_by_id_.end() && skip_special_tokens && added_[it->second].special) {
      continue;
    }
    // The ByteLevel decoder: a token whose characters all map to bytes gives those bytes,
    // any other token (an added token such as "<|im_end|>" maps too) its own UTF-8.
    const auto& token = id_to_token_[static_cast<size_t>(id)];
    const size_t start = bytes.size();
    bool mapped = true;
    for (const auto& cp : unicode::decode_utf8(token)) {
      const int b = cp.value < byte_map().decode.size() ? byte_map().decode[cp.value] : -1;
      if (b < 0) {
        mapped = false;
        break;
      }
      bytes += static_cast<char>(b);
    }
    if (!mapped) bytes.replace(start, std::string::npos, token);
  }
  return unicode::sanitize_utf8(bytes);
}

}  // namespace hyflow::tokenizers
