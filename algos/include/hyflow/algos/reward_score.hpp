#pragma once
// Rule-based reward scorers of verl's verl/utils/reward_score/ (gsm8k, math_reward,
// math_dapo, default_compute_score) plus hyflow's built-in tasks (arithmetic, countdown,
// char_count) and a registry of named compute_score functions. Strings are UTF-8; "last N
// characters" counts code points like Python. Differences from verl are listed in docs/algorithms.md.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::algos::reward_score {

/// A scorer's result. verl scorers return a float or a dict with "score": `extra_info` holds
/// the dict's other keys (e.g. acc, pred for math_dapo) and is an empty object otherwise.
struct ScoreResult {
  double score = 0.0;
  nlohmann::json extra_info = nlohmann::json::object();
};

namespace gsm8k {
/// strict: last "#### <number>" in the last 300 characters, with ',' and '$' removed;
/// flexible: the last number-like token that is not "." (no marker needed).
/// Other methods: hyflow::ValueError.
std::optional<std::string> extract_solution(const std::string& solution_str, const std::string& method = "strict");
/// score if the extracted answer equals ground_truth exactly, format_score if it differs,
/// 0 if nothing was extracted.
double compute_score(const std::string& solution_str, const std::string& ground_truth,
                     const std::string& method = "strict", double format_score = 0.0, double score = 1.0);
}  // namespace gsm8k

namespace math {
/// The last "\boxed{...}" (balanced braces), "\boxed <text up to $>" or "\fbox{...}".
std::optional<std::string> last_boxed_only_string(const std::string& string);
/// Strips "\boxed " or "\boxed{...}"; anything else: hyflow::ValueError.
std::string remove_boxed(const std::string& s);
/// Hendrycks-MATH normalisation (verl's steps in order). Throws hyflow::ValueError where
/// verl's Python raises (e.g. two "\text{ " units, a trailing "\sqrt").
std::string strip_string(const std::string& string);
/// strip_string equality; when normalising throws, the raw strings are compared (as verl).
bool is_equiv(const std::optional<std::string>& str1, const std::optional<std::string>& str2);
/// 1.0 if the last boxed answer is_equiv to ground_truth, else 0.0.
double compute_score(const std::string& solution_str, const std::string& ground_truth);
}  // namespace math

namespace math_dapo {
/// The last "\boxed{...}" only.
std::optional<std::string> last_boxed_only_string(const std::string& string);
std::string remove_boxed(const std::string& s);
/// Minerva answer normalisation (DAPO), on code points with Python's str and re semantics.
std::string normalize_final_answer(const std::string& final_answer);
/// Last "Answer: ..." line (case-insensitive, as Python's re), normalised, against
/// normalize(gt); "[INVALID]" (normalised) when there is none.
std::pair<bool, std::string> is_correct_minerva(const std::string& solution_str, const std::string& gt,
                                                bool gt_need_extract = false);
/// The boxed answer in the last 100 characters (or in pred[pause_tokens_index[3] - 100:],
/// Python slice semantics) compared verbatim with gt: {1 or -1, the answer}; the answer is
/// nullopt when there is no "\boxed{...}". pause_tokens_index must hold 4 indices.
std::pair<int, std::optional<std::string>> is_correct_strict_box(
    const std::string& pred, const std::string& gt,
    const std::optional<std::vector<int64_t>>& pause_tokens_index = std::nullopt);
/// strict_box_verify ? is_correct_strict_box : is_correct_minerva, as {correct, pred}.
std::pair<bool, std::optional<std::string>> verify(
    const std::string& solution_str, const std::string& answer, bool strict_box_verify = false,
    const std::optional<std::vector<int64_t>>& pause_tokens_index = std::nullopt);
/// On the last 300 characters: score +1/-1, extra_info {acc, pred}; pred is null when the
/// strict-box check finds no boxed answer.
ScoreResult compute_score(const std::string& solution_str, const std::string& ground_truth,
                          bool strict_box_verify = false,
                          const std::optional<std::vector<int64_t>>& pause_tokens_index = std::nullopt);
}  // namespace math_dapo

namespace arithmetic {
/// The last number (-?digits[.digits]) in the response, commas removed.
std::optional<std::string> extract_answer(const std::string& solution_str);
/// 1.0 if that number equals ground_truth (relative tolerance 1e-9), else 0.0.
double compute_score(const std::string& solution_str, const std::string& ground_truth);
}  // namespace arithmetic

namespace countdown {
/// Text of the last <answer>...</answer>, trimmed.
std::optional<std::string> extract_solution(const std::string& solution_str);
/// The equation uses exactly the given numbers (as a multiset).
bool validate_equation(const std::string& equation, const std::vector<int64_t>& numbers);
/// Value of an expression of numbers, + - * / and parentheses; nullopt if it is not one
/// (other characters, syntax error, division by zero).
std::optional<double> evaluate_equation(const std::string& equation);
/// ground_truth {"target": n, "numbers": [..]} (or that JSON as a string): score if the
/// equation is valid and hits the target (|diff| < 1e-5), format_score if an equation was
/// given but is wrong or invalid, 0 without an <answer>.
double compute_score(const std::string& solution_str, const nlohmann::json& ground_truth,
                     double format_score = 0.1, double score = 1.0);
}  // namespace countdown

namespace char_count {
/// The answer of a char_count response. A response with a boxed expression (verl's
/// math last_boxed_only_string) answers with its content (remove_boxed; nullopt for a form
/// remove_boxed rejects, such as \fbox{...}, which verl's reward scores 0). Otherwise the text
/// between the last "<answer>" and the "</answer>" after it: how hyflow's built-in task
/// writes it, the char tokenizer having no backslash or braces. Neither: nullopt.
std::optional<std::string> extract_answer(const std::string& solution_str);
/// verl-recipe char_count's reward: 1.0 if the answer equals ground_truth exactly (no
/// normalisation, " 3" is not "3"), 0.0 otherwise or without an answer.
double compute_score(const std::string& solution_str, const std::string& ground_truth);
}  // namespace char_count

/// Routes by data_source: openai/gsm8k; lighteval/MATH, DigitalLearningGmbH/MATH-lighteval,
/// HuggingFaceH4/MATH-500; math_dapo, math, math_dapo_reasoning, aime*; arithmetic;
/// countdown; char_count. Unknown or unavailable data sources: hyflow::KeyError naming it.
/// hyflow extension: extra_info["hyflow_gsm8k_method"] ("strict" | "flexible") picks the
/// gsm8k method (verl always uses strict); verl's own keys are never read.
ScoreResult default_compute_score(const std::string& data_source, const std::string& solution_str,
                                  const nlohmann::json& ground_truth,
                                  const nlohmann::json& extra_info = nlohmann::json());

/// A reward function: (data_source, solution_str, ground_truth, extra_info) -> result.
using ComputeScoreFn = std::function<ScoreResult(const std::string& data_source, const std::string& solution_str,
                                                 const nlohmann::json& ground_truth,
                                                 const nlohmann::json& extra_info)>;

/// Registers a reward function by name ("default" is default_compute_score). Re-registering
/// a taken name throws hyflow::ValueError unless `overwrite`.
void register_compute_score(const std::string& name, ComputeScoreFn fn, bool overwrite = false);
/// Unknown names: hyflow::KeyError listing the registered ones.
ComputeScoreFn get_compute_score(const std::string& name);
std::vector<std::string> registered_compute_scores();

}  // namespace hyflow::algos::reward_score
