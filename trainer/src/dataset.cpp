// JSONL and Parquet reading, the built-in tasks (arithmetic, multiplication, char_count) and tokenization
// of RL/SFT rows.
#include <hyflow/core/error.hpp>
#include <hyflow/models/config.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/tokenizers/tokenizer_dir.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/parquet.hpp>

#include <algorithm>
#include <filesystem>

#include <fstream>
#include <random>
#include <sstream>

namespace hyflow::trainer {

namespace {

std::string prompt_text(const nlohmann::json& prompt, const std::string& where) {
  if (prompt.is_string()) return prompt.get<std::string>();
  if (prompt.is_array()) {
    std::string text;
    for (const auto& m : prompt) {
      if (!m.is_object() || !m.contains("content") || !m.at("content").is_string())
        throw FormatError(where + ": chat message without a string 'content'");
      text += m.at("content").get<std::string>();
    }
    return text;
  }
  throw FormatError(where + ": prompt is neither text nor a list of chat messages");
}

std::vector<int64_t> truncate(std::vector<int64_t> ids, int64_t max_len, const std::string& mode, int64_t row) {
  const auto n = static_cast<int64_t>(ids.size());
  if (n <= max_len) return ids;
  if (mode == "left") return {ids.end() - max_len, ids.end()};
  if (mode == "right") return {ids.begin(), ids.begin() + max_len};
  if (mode == "middle") {
    const int64_t left = max_len / 2, right = max_len - left;
    std::vector<int64_t> out(ids.begin(), ids.begin() + left);
    out.insert(out.end(), ids.end() - right, ids.end());
    return out;
  }
  if (mode == "error")
    throw ValueError("row " + std::to_string(row) + ": " + std::to_string(n) + " tokens exceed the maximum " +
                     std::to_string(max_len) + " (data.truncation=error)");
  throw ValueError("config key 'data.truncation': unknown mode '" + mode + "' (error, left, right, middle)");
}

}  // namespace

namespace {
/// A row of verl's columns as a Sample; `where` names the row in messages (file:line, file row N).
Sample sample_of_row(const nlohmann::json& row, const std::string& where, const std::string& prompt_key,
                     const std::string& response_key) {
  if (!row.contains(prompt_key)) throw FormatError(where + ": missing column '" + prompt_key + "'");
  Sample s;
  s.prompt = prompt_text(row.at(prompt_key), where);
  if (!response_key.empty()) {
    if (!row.contains(response_key) || !row.at(response_key).is_string())
      throw FormatError(where + ": missing text column '" + response_key + "'");
    s.response = row.at(response_key).get<std::string>();
  }
  if (row.contains("data_source") && !row.at("data_source").is_null()) {
    if (!row.at("data_source").is_string()) throw FormatError(where + ": data_source is not a string");
    s.data_source = row.at("data_source").get<std::string>();
  }
  if (row.contains("reward_model") && !row.at("reward_model").is_null()) {
    const auto& rm = row.at("reward_model");
    if (!rm.is_object()) throw FormatError(where + ": reward_model is not an object");
    if (rm.contains("ground_truth")) s.ground_truth = rm.at("ground_truth");
  }
  if (row.contains("extra_info") && !row.at("extra_info").is_null()) {
    if (!row.at("extra_info").is_object()) throw FormatError(where + ": extra_info is not an object");
    s.extra_info = row.at("extra_info");
  }
  return s;
}
}  // namespace

std::vector<Sample> read_jsonl(const std::string& path, const std::string& prompt_key,
                               const std::string& response_key) {
  std::ifstream in(path);
  if (!in) throw FormatError("cannot open dataset file '" + path + "'");
  std::vector<Sample> out;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) throw FormatError(where + ": not a JSON object");
    out.push_back(sample_of_row(row, where, prompt_key, response_key));
  }
  if (in.bad()) throw FormatError("dataset file '" + path + "': read error");
  if (out.empty()) throw FormatError("dataset file '" + path + "' has no rows (empty or only blank lines)");
  return out;
}

std::vector<Sample> read_parquet_samples(const std::string& path, const std::string& prompt_key,
                                         const std::string& response_key) {
  std::vector<std::string> columns{prompt_key, "data_source", "reward_model", "extra_info"};
  if (!response_key.empty()) columns.push_back(response_key);
  const std::vector<nlohmann::json> rows = read_parquet(path, columns);
  if (rows.empty()) throw FormatError("dataset file '" + path + "' has no rows");
  std::vector<Sample> out;
  out.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    out.push_back(sample_of_row(rows[i], path + " row " + std::to_string(i), prompt_key, response_key));
  return out;
}

std::vector<Sample> make_arithmetic_task(int64_t count, int64_t max_operand, uint64_t seed, double correct_fraction) {
  if (count < 0 || max_operand < 0) throw ValueError("arithmetic task: count and max_operand must be >= 0");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> operand(0, max_operand);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int64_t> offset(1, 9);
  std::vector<Sample> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t a = operand(rng), b = operand(rng);
    Sample s;
    s.prompt = std::to_string(a) + "+" + std::to_string(b) + "=";
    s.data_source = "arithmetic";
    s.ground_truth = std::to_string(a + b);
    const bool correct = unit(rng) < correct_fraction;
    s.response = std::to_string(correct ? a + b : a + b + offset(rng));
    s.extra_info = {{"index", i}, {"split", "synthetic"}};
    out.push_back(std::move(s));
  }
  return out;
}

bool multiplication_held_out(int64_t a, int64_t b) {
  uint64_t x = static_cast<uint64_t>(a) * 1000003ULL + static_cast<uint64_t>(b);  // splitmix64's finalizer
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return (x ^ (x >> 31)) % 10 == 0;
}

std::vector<Sample> make_multiplication_task(int64_t count, int64_t digits, uint64_t seed, bool held_out,
                                             double correct_fraction) {
  if (count < 0) throw ValueError("multiplication task: count must be >= 0, got " + std::to_string(count));
  if (digits < 1 || digits > 9)
    throw ValueError("multiplication task: the operand digits (data.synthetic.max_operand) must be in 1..9, got " +
                     std::to_string(digits));
  int64_t low = 1;
  for (int64_t i = 1; i < digits; ++i) low *= 10;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> operand(digits == 1 ? 0 : low, low * 10 - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int64_t> offset(1, 9);
  std::vector<Sample> out;
  out.reserve(static_cast<size_t>(count));
  while (static_cast<int64_t>(out.size()) < count) {
    const int64_t a = operand(rng), b = operand(rng);
    if (multiplication_held_out(a, b) != held_out) continue;
    Sample s;
    s.prompt = std::to_string(a) + "*" + std::to_string(b) + "=";
    s.data_source = "arithmetic";
    s.ground_truth = std::to_string(a * b);
    const bool correct = unit(rng) < correct_fraction;
    s.response = std::to_string(correct ? a * b : a * b + offset(rng));
    s.extra_info = {{"index", static_cast<int64_t>(out.size())}, {"split", held_out ? "held_out" : "train"}};
    out.push_back(std::move(s));
  }
  return out;
}

// How an answer without the tool begins: a first token of its own, unlike the call's "<", so that after a
// warm-up with some problems through the tool (tool_fraction) greedy decoding follows the larger share.
constexpr const char* kInHeadAnswerLead = "The product is ";

std::vector<Sample> make_multiplication_chat_task(int64_t count, int64_t digits, uint64_t seed, bool held_out,
                                                  const tokenizers::ChatTemplateOptions& chat, double tool_fraction,
                                                  double correct_fraction) {
  if (!(tool_fraction >= 0.0 && tool_fraction <= 1.0))
    throw ValueError("multiplication_calculator task: the fraction of problems with the tool call "
                     "(data.synthetic.tool_fraction) must be in [0, 1], got " + std::to_string(tool_fraction));
  using tokenizers::ChatMessage;
  tokenizers::ChatTemplateOptions prompt_options = chat, turn_options = chat;
  prompt_options.tools.clear();
  prompt_options.add_generation_prompt = true;
  turn_options.tools.clear();
  turn_options.add_generation_prompt = false;
  const std::string end = "<|im_end|>";
  std::mt19937_64 tool_rng(seed ^ 0x746f6f6cULL);  // its own stream: the problems do not depend on the fraction
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<Sample> out;
  for (Sample& problem : make_multiplication_task(count, digits, seed, held_out, correct_fraction)) {
    const bool with_tool = unit(tool_rng) < tool_fraction;
    const std::string expression = problem.prompt.substr(0, problem.prompt.size() - 1);  // "1234*5678"
    const ChatMessage user{"user", problem.prompt};
    Sample first = problem;
    first.prompt = tokenizers::apply_chatml({user}, prompt_options);
    if (!with_tool) {
      first.response = kInHeadAnswerLead + first.response + ".";
      first.extra_info["turn"] = "answer";
      out.push_back(std::move(first));
      continue;
    }
    nlohmann::ordered_json arguments = {{"expression", expression}};
    const ChatMessage call{"assistant", "", {{.name = "calculator", .arguments = arguments}}};
    const std::string with_call = tokenizers::apply_chatml({user, call}, turn_options);
    const std::string call_text = with_call.substr(std::min(first.prompt.size(), with_call.size()));
    if (with_call.compare(0, first.prompt.size(), first.prompt) != 0 || call_text.size() < end.size() + 1 ||
        call_text.compare(call_text.size() - end.size() - 1, end.size(), end) != 0)
      throw ValueError("multiplication_calculator task: the chat template does not render the call as an assistant "
                       "turn ending on " + end);
    first.response = call_text.substr(0, call_text.size() - end.size() - 1);
    first.extra_info["turn"] = "call";
    Sample second = problem;
    second.prompt =
        tokenizers::apply_chatml({user, call, {"tool", problem.ground_truth.get<std::string>()}}, prompt_options);
    const std::string before_tool = first.prompt + first.response + end;
    if (second.prompt.compare(0, before_tool.size(), before_tool) != 0)
      throw ValueError("multiplication_calculator task: the chat template's tool turn does not follow the call's " +
                       end);
    second.extra_info["turn"] = "answer";
    out.push_back(std::move(first));
    out.push_back(std::move(second));
  }
  return out;
}

bool is_chat_task(const std::string& task) {
  return task == "multiplication_calculator" || task == "multiplication_chat";
}

std::vector<Sample> make_char_count_task(int64_t count, int64_t max_length, uint64_t seed, double correct_fraction) {
  if (count < 0) throw ValueError("char_count task: count must be >= 0, got " + std::to_string(count));
  if (max_length < 5)
    throw ValueError(
        "char_count task: the longest word (data.synthetic.max_operand) must be >= 5 (the asked letter "
        "at least once among 3 or 4 others), got " +
        std::to_string(max_length));
  std::mt19937_64 rng(seed);
  // At least 3 letters other than the asked one: every (count, others) class then holds
  // C(n, count) * 25^others * 26 >= 1.6 million prompts, so independent draws (the training set
  // and the held-out set, seed + 7919) practically never share a prompt. With the count up to
  // the length, words like "aaa" (26 per length) made a third of the held-out prompts training ones.
  std::uniform_int_distribution<int64_t> count_of(1, max_length - 4), others_of(3, 4);
  std::uniform_int_distribution<int> letter(0, 25), other(0, 24);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int64_t> offset(1, 9);
  std::vector<Sample> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t hits = count_of(rng);
    const int64_t n = hits + others_of(rng);
    const char target = static_cast<char>('a' + letter(rng));
    std::string word;
    for (int64_t k = 0; k < n; ++k) {
      if (k < hits) {
        word += target;
      } else {
        const char c = static_cast<char>('a' + other(rng));  // 25 letters: skip the target
        word += c >= target ? static_cast<char>(c + 1) : c;
      }
    }
    std::shuffle(word.begin(), word.end(), rng);
    std::string dashed, steps;
    for (char c : word) {
      if (!dashed.empty()) dashed += '-';
      dashed += c;
      steps += std::string(1, c) + (c == target ? " = " : " != ") + target + ".\n";
    }
    Sample s;
    s.prompt = std::string("How many ") + target + " are there in word " + dashed + "?";
    s.data_source = "char_count";
    s.ground_truth = std::to_string(hits);
    const bool correct = unit(rng) < correct_fraction;
    s.response = steps + "<answer>" + std::to_string(correct ? hits : hits + offset(rng)) + "</answer>";
    s.extra_info = {{"index", i}, {"split", "synthetic"}};
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Sample> load_samples(const std::string& files, const SyntheticTask& synthetic,
                                 const std::string& prompt_key, const std::string& response_key) {
  if (files.empty()) {
    if (synthetic.task == "arithmetic")
      return make_arithmetic_task(synthetic.size, synthetic.max_operand, synthetic.seed, synthetic.correct_fraction);
    if (synthetic.task == "char_count")
      return make_char_count_task(synthetic.size, synthetic.max_operand, synthetic.seed, synthetic.correct_fraction);
    if (synthetic.task == "multiplication")
      return make_multiplication_task(synthetic.size, synthetic.max_operand, synthetic.seed, synthetic.held_out,
                                      synthetic.correct_fraction);
    if (is_chat_task(synthetic.task)) {
      const double tool_fraction = synthetic.task == "multiplication_calculator" ? synthetic.tool_fraction : 0.0;
      return make_multiplication_chat_task(synthetic.size, synthetic.max_operand, synthetic.seed, synthetic.held_out,
                                           synthetic.chat, tool_fraction, synthetic.correct_fraction);
    }
    throw ValueError("config key 'data.synthetic.task': unknown built-in task '" + synthetic.task +
                     "' (arithmetic, char_count, multiplication, multiplication_calculator, multiplication_chat)");
  }
  std::vector<Sample> out;
  std::stringstream ss(files);
  for (std::string file; std::getline(ss, file, ',');) {
    if (file.empty()) continue;
    auto rows = is_parquet_file(file) ? read_parquet_samples(file, prompt_key, response_key)
                                      : read_jsonl(file, prompt_key, response_key);
    out.insert(out.end(), std::make_move_iterator(rows.begin()), std::make_move_iterator(rows.end()));
  }
  return out;
}

RLDataset::RLDataset(std::vector<Sample> samples, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
                     RLDatasetOptions options)
    : tokenizer_(std::move(tokenizer)), options_(std::move(options)) {
  if (options_.max_prompt_length <= 0) throw ValueError("config key 'data.max_prompt_length' must be > 0");
  for (size_t i = 0; i < samples.size(); ++i) {
    auto ids = tokenizer_->encode(samples[i].prompt);
    if (options_.filter_overlong_prompts && static_cast<int64_t>(ids.size()) > options_.max_prompt_length) continue;
    ids = truncate(std::move(ids), options_.max_prompt_length, options_.truncation, static_cast<int64_t>(i));
    if (!samples[i].extra_info.contains("index")) samples[i].extra_info["index"] = static_cast<int64_t>(i);
    ids_.push_back(std::move(ids));
    samples_.push_back(std::move(samples[i]));
  }
}

DataProto RLDataset::batch(const std::vector<int64_t>& indices) const {
  const auto B = static_cast<int64_t>(indices.size());
  const int64_t P = options_.max_prompt_length;
  auto ids = torch::full({B, P}, tokenizer_->pad_token_id(), torch::kLong);
  auto mask = torch::zeros({B, P}, torch::kLong);
  dataproto::Column data_source, reward_model, extra_info, raw_prompt;
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t r = 0; r < B; ++r) {
    const auto i = static_cast<size_t>(indices[static_cast<size_t>(r)]);
    if (i >= ids_.size())
      throw ShapeError("dataset index " + std::to_string(i) + " out of " + std::to_string(ids_.size()));
    const auto& row = ids_[i];
    const int64_t start = P - static_cast<int64_t>(row.size());
    for (size_t t = 0; t < row.size(); ++t) {
      ids_a[r][start + static_cast<int64_t>(t)] = row[t];
      mask_a[r][start + static_cast<int64_t>(t)] = 1;
    }
    data_source.emplace_back(samples_[i].data_source);
    reward_model.push_back({{"ground_truth", samples_[i].ground_truth}, {"style", "rule"}});
    extra_info.push_back(samples_[i].extra_info);
    raw_prompt.emplace_back(samples_[i].prompt);
  }
  auto pos = (mask.cumsum(-1) - 1).clamp_min(0);
  dataproto::NonTensorBatch nt;
  nt["data_source"] = std::move(data_source);
  nt["reward_model"] = std::move(reward_model);
  nt["extra_info"] = std::move(extra_info);
  nt["raw_prompt"] = std::move(raw_prompt);
  return DataProto(TensorDict{{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos}}, std::move(nt));
}

SFTDataset::SFTDataset(std::vector<Sample> samples, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
                       int64_t max_length, std::string truncation)
    : max_length_(max_length), pad_id_(tokenizer->pad_token_id()) {
  if (max_length <= 1) throw ValueError("config key 'data.max_length' must be > 1");
  for (size_t i = 0; i < samples.size(); ++i) {
    auto ids = tokenizer->encode(samples[i].prompt);
    const auto prompt_len = static_cast<int64_t>(ids.size());
    auto resp = tokenizer->encode(samples[i].response);
    ids.insert(ids.end(), resp.begin(), resp.end());
    ids.push_back(tokenizer->eos_token_id());
    if (static_cast<int64_t>(ids.size()) > max_length) {
      if (truncation == "middle") throw ValueError("config key 'data.truncation': SFT takes error, left or right");
      const auto n = static_cast<int64_t>(ids.size());
      ids = truncate(std::move(ids), max_length, truncation, static_cast<int64_t>(i));
      prompt_lengths_.push_back(truncation == "left" ? std::max<int64_t>(0, prompt_len - (n - max_length))
                                                     : prompt_len);
    } else {
      prompt_lengths_.push_back(prompt_len);
    }
    input_ids_.push_back(std::move(ids));
  }
}

DataProto SFTDataset::batch(const std::vector<int64_t>& indices) const {
  const auto B = static_cast<int64_t>(indices.size());
  auto ids = torch::full({B, max_length_}, pad_id_, torch::kLong);
  auto mask = torch::zeros({B, max_length_}, torch::kLong);
  auto loss_mask = torch::zeros({B, max_length_}, torch::kLong);
  for (int64_t r = 0; r < B; ++r) {
    const auto i = static_cast<size_t>(indices[static_cast<size_t>(r)]);
    const auto& row = input_ids_.at(i);
    const auto n = static_cast<int64_t>(row.size());
    ids[r].narrow(0, 0, n).copy_(torch::tensor(row, torch::kLong));
    mask[r].narrow(0, 0, n).fill_(1);
    const int64_t p = std::min(prompt_lengths_[i], n);
    if (n > p) loss_mask[r].narrow(0, p, n - p).fill_(1);
  }
  auto pos = (mask.cumsum(-1) - 1).clamp_min(0);
  return DataProto(
      TensorDict{{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos}, {"loss_mask", loss_mask}});
}

std::shared_ptr<const tokenizers::Tokenizer> load_tokenizer(const std::string& model_dir) {
  auto tokenizer = tokenizers::read_tokenizer_dir(model_dir);
  // Ids the model has no embedding row for would fail only at generation ("index out of range").
  const auto config_file = std::filesystem::path(model_dir) / "config.json";
  if (std::filesystem::exists(config_file)) {
    const int64_t model_vocab = models::load_config(config_file).vocab_size;
    if (tokenizer->vocab_size() > model_vocab)
      throw ValueError("model directory '" + model_dir + "': the tokenizer has ids up to " +
                       std::to_string(tokenizer->vocab_size() - 1) + " but config.json's vocab_size is " +
                       std::to_string(model_vocab) + " (tokenizer and model do not belong together)");
  }
  return tokenizer;
}

void save_char_tokenizer_config(const std::string& model_dir, const tokenizers::CharTokenizerOptions& options) {
  std::ofstream(std::filesystem::path(model_dir) / "tokenizer_config.json")
      << nlohmann::json{{"tokenizer_class", "hyflow-char"}, {"alphabet", options.alphabet},
                        {"special_tokens", options.special_tokens}, {"eos_token", options.eos_token},
                        {"pad_token", options.pad_token}}
             .dump(2);
}

std::vector<int64_t> epoch_order(int64_t size, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) order[static_cast<size_t>(i)] = i;
  if (shuffle) {
    std::mt19937_64 rng(seed * 1000003ULL + static_cast<uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
  }
  return order;
}

}  // namespace hyflow::trainer
