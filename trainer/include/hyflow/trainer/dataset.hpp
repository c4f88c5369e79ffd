#pragma once
// RL and SFT datasets (verl's rl_dataset.py / sft_dataset.py): JSONL or Parquet rows with verl's columns
// (prompt as chat messages or text, data_source, reward_model.ground_truth, extra_info), the
// built-in synthetic tasks (arithmetic, char_count), tokenization with left padding (RL) or
// right padding with a loss mask (SFT), prompt-length filtering and truncation modes, and the
// seeded epoch order of the sampler.

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/tokenizers/chat_template.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/tokenizers/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::trainer {

/// One row: prompt text (chat messages are joined by their contents), optional response
/// (SFT), data_source, ground truth and extra_info.
struct Sample {
  std::string prompt;
  std::string response;
  std::string data_source;
  nlohmann::json ground_truth;
  nlohmann::json extra_info = nlohmann::json::object();
};

/// Reads a JSONL file. A line that is not a JSON object, or lacks the prompt column (or the
/// response column when response_key is given): hyflow::FormatError naming file:line.
std::vector<Sample> read_jsonl(const std::string& path, const std::string& prompt_key = "prompt",
                               const std::string& response_key = "");
/// Reads a Parquet file of verl's columns (examples/data_preprocess/*.py; hyflow/trainer/parquet.hpp):
/// the prompt column (text or chat messages), data_source, reward_model.ground_truth, extra_info
/// and, when given, the response column. A row without the prompt column: hyflow::FormatError
/// naming the file and the row.
std::vector<Sample> read_parquet_samples(const std::string& path, const std::string& prompt_key = "prompt",
                                         const std::string& response_key = "");

/// The built-in arithmetic task: "a+b=" (operands in [0, max_operand]) with the sum as
/// ground truth and as SFT response, data_source "arithmetic". Deterministic in `seed`.
/// correct_fraction < 1 gives that fraction of right SFT responses (the others off by 1..9).
std::vector<Sample> make_arithmetic_task(int64_t count, int64_t max_operand, uint64_t seed,
                                         double correct_fraction = 1.0);

/// The built-in char_count task (verl-recipe char_count): "How many r are there in word s-t-r-a-w?"
/// for a dashed word of random lowercase letters: the asked letter 1..max_length-4 times
/// (uniform) among 3 or 4 (uniform) other letters different from it, so words of
/// 4..max_length letters; at least 3 other letters keep every class of words large enough
/// that a held-out draw shares no prompt with a training draw. The SFT response spells the
/// word out, one line per letter ("s != r." or "r = r.") and ends with the count in answer
/// tags, "<answer>1</answer>" (the char tokenizer has no backslash or braces for verl's
/// \boxed{1}); the count as text is the ground truth, data_source "char_count". Deterministic
/// in `seed`; correct_fraction < 1 gives that fraction of right SFT answers (the others' count
/// off by 1..9). max_length < 5: hyflow::ValueError naming data.synthetic.max_operand.
std::vector<Sample> make_char_count_task(int64_t count, int64_t max_length, uint64_t seed,
                                         double correct_fraction = 1.0);

/// The built-in multiplication task (issue 29's tool task): "a*b=" with `digits`-digit operands
/// (4: 1000..9999, a product no tiny model computes in its head) and the product as ground truth
/// and SFT response, data_source "arithmetic" (its scorer). Each pair belongs to one split by a
/// fixed hash of (a, b), about one pair in ten held out: `held_out` draws only held-out pairs, else
/// only training pairs, so validation problems never occur in training whatever the seeds.
/// Deterministic in `seed`; correct_fraction as for arithmetic. digits outside 1..9:
/// hyflow::ValueError naming data.synthetic.max_operand.
std::vector<Sample> make_multiplication_task(int64_t count, int64_t digits, uint64_t seed, bool held_out,
                                             double correct_fraction = 1.0);
/// Whether the multiplication task's pair (a, b) is in the held-out split.
bool multiplication_held_out(int64_t a, int64_t b);

/// The multiplication task through a chat template, as SFT rows (the warm-ups of issue 29's tool
/// task): the user message is the task's prompt ("1234*5678="), rendered by `chat` (its `tools`
/// are not listed: the warm-up teaches the call) with the generation prompt, exactly as the agent
/// loops render a row's raw prompt. A problem drawn with the tool (each with probability
/// `tool_fraction`, from a stream of its own: 1 all, 0 none) gives two rows, the model's two turns (the
/// loss falls on each row's response): prompt -> the hermes call
/// `<tool_call>\n{"name": "calculator", "arguments": {"expression": "1234*5678"}}\n</tool_call>`, and
/// that prompt + call + end token + the template's tool turn with the product -> the product
/// (the ids the tool agent loop builds); one without: one row, prompt -> "The product is 7006652." (a
/// first character unlike the call's, so greedy decoding after a mixed warm-up follows the larger
/// share). The problems are
/// make_multiplication_task's (same split, seed and correct_fraction: a wrong product is the final
/// answer's); extra_info "turn" is "call" or "answer". ValueError when the template does not put the
/// tool turn after the call's end token "<|im_end|>", or tool_fraction is outside [0, 1].
std::vector<Sample> make_multiplication_chat_task(int64_t count, int64_t digits, uint64_t seed, bool held_out,
                                                  const tokenizers::ChatTemplateOptions& chat, double tool_fraction,
                                                  double correct_fraction = 1.0);

/// Rows of a file list ("a.jsonl,train.parquet"; a file starting with Parquet's magic "PAR1"
/// is read as Parquet, any other as JSONL) or, when `files` is empty, of the built-in task
/// (`task` arithmetic, char_count, multiplication or, SFT rows through the chat template `chat`,
/// multiplication_calculator (with the tool call) and multiplication_chat (the answer directly);
/// `max_operand` is char_count's longest word, multiplication's operand digits; `held_out` picks
/// multiplication's held-out split).
struct SyntheticTask {
  std::string task = "arithmetic";
  int64_t size = 0;
  int64_t max_operand = 99;
  uint64_t seed = 0;
  double correct_fraction = 1.0;
  double tool_fraction = 1.0;  ///< multiplication_calculator: the fraction of problems answered through the tool
  bool held_out = false;  ///< the validation draw (multiplication: pairs disjoint from training's)
  tokenizers::ChatTemplateOptions chat = {};  ///< the chat tasks' template (data.apply_chat_template_kwargs)
};
/// Whether `task` is a built-in task rendered through the chat template (multiplication_calculator,
/// multiplication_chat): its tokenizer must hold the template's special tokens (tokenizers::chat_char_options).
bool is_chat_task(const std::string& task);
std::vector<Sample> load_samples(const std::string& files, const SyntheticTask& synthetic,
                                 const std::string& prompt_key = "prompt", const std::string& response_key = "");

struct RLDatasetOptions {
  int64_t max_prompt_length = 512;
  std::string truncation = "error";  ///< error | left | right | middle
  bool filter_overlong_prompts = false;
};

/// Tokenized prompts, left-padded to max_prompt_length.
class RLDataset {
 public:
  /// Overlong prompts are dropped (filter_overlong_prompts) or truncated; with "error" a
  /// hyflow::ValueError names the row and its length.
  RLDataset(std::vector<Sample> samples, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
            RLDatasetOptions options);
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const Sample& sample(int64_t i) const { return samples_.at(static_cast<size_t>(i)); }
  /// input_ids, attention_mask, position_ids (B, max_prompt_length) and non-tensor columns
  /// data_source, reward_model ({"ground_truth": ..}), extra_info (with "index"), raw_prompt.
  DataProto batch(const std::vector<int64_t>& indices) const;

 private:
  std::vector<Sample> samples_;
  std::vector<std::vector<int64_t>> ids_;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer_;
  RLDatasetOptions options_;
};

/// SFT rows: prompt + response + eos, right-padded to max_length; loss_mask marks the
/// response tokens (and eos). truncation error | left | right.
class SFTDataset {
 public:
  SFTDataset(std::vector<Sample> samples, std::shared_ptr<const tokenizers::Tokenizer> tokenizer, int64_t max_length,
             std::string truncation = "error");
  int64_t size() const { return static_cast<int64_t>(input_ids_.size()); }
  /// input_ids, attention_mask, position_ids, loss_mask (B, max_length).
  DataProto batch(const std::vector<int64_t>& indices) const;

 private:
  std::vector<std::vector<int64_t>> input_ids_;
  std::vector<int64_t> prompt_lengths_;
  int64_t max_length_;
  int64_t pad_id_;
};

/// The tokenizer of a model directory: tokenizer_config.json with tokenizer_class
/// "hyflow-char" (optional "alphabet") gives the char tokenizer, else tokenizer.json (BPE).
/// FormatError naming the directory when neither is there, naming the file when
/// tokenizer_config.json is not a JSON object; ValueError when the tokenizer has ids beyond the
/// vocab_size of the directory's config.json.
std::shared_ptr<const tokenizers::Tokenizer> load_tokenizer(const std::string& model_dir);
/// Writes tokenizer_config.json for the char tokenizer of `options` (default: the built-in tasks') into `model_dir`.
void save_char_tokenizer_config(const std::string& model_dir, const tokenizers::CharTokenizerOptions& options = {});

/// Row order of an epoch: a permutation seeded by (seed, epoch) when shuffling, else 0..n-1.
std::vector<int64_t> epoch_order(int64_t size, bool shuffle, uint64_t seed, int64_t epoch);

}  // namespace hyflow::trainer
