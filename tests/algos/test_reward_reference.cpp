// math_dapo and gsm8k against Python: tests/algos/data/make_reward_reference.py runs verl's
// normalisation and extraction rules with Python's str and re on a corpus of multi-byte
// characters, Unicode spaces and digits, case-insensitive letters and regex corner cases.
#include <hyflow/algos/reward_score.hpp>

#include "reference_data.hpp"

#include <catch2/catch.hpp>

using namespace hyflow::algos::reward_score;
using Json = nlohmann::json;

namespace {
std::optional<std::string> opt_string(const Json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<std::string>();
}
}  // namespace

TEST_CASE("math_dapo normalize_final_answer equals Python on every corpus string") {
  const auto ref = hyflow::test::load_reference("reward_reference.json");
  REQUIRE(ref.at("normalize_final_answer").size() > 60);
  for (const auto& c : ref.at("normalize_final_answer")) {
    const auto input = c[0].get<std::string>();
    CAPTURE(input);
    CHECK(math_dapo::normalize_final_answer(input) == c[1].get<std::string>());
  }
}

TEST_CASE("math_dapo Minerva extraction equals Python's re.findall with (?i) and \\s") {
  const auto ref = hyflow::test::load_reference("reward_reference.json");
  for (const auto& c : ref.at("minerva")) {
    const auto solution = c.at("solution").get<std::string>();
    const auto gt = c.at("gt").get<std::string>();
    CAPTURE(solution, gt);
    const auto [correct, pred] = math_dapo::is_correct_minerva(solution, gt);
    CHECK(pred == c.at("pred").get<std::string>());
    CHECK(correct == c.at("correct").get<bool>());
  }
}

TEST_CASE("math_dapo strict box: answer or no answer (None), with and without pause_tokens_index") {
  const auto ref = hyflow::test::load_reference("reward_reference.json");
  for (const auto& c : ref.at("strict_box")) {
    const auto solution = c.at("solution").get<std::string>();
    const auto gt = c.at("gt").get<std::string>();
    std::optional<std::vector<int64_t>> pause;
    if (c.contains("pause")) pause = c.at("pause").get<std::vector<int64_t>>();
    CAPTURE(solution, gt, c.dump());
    const auto [score, pred] = math_dapo::is_correct_strict_box(solution, gt, pause);
    CHECK(score == c.at("score").get<int>());
    CHECK(pred == opt_string(c.at("pred")));
  }
}

TEST_CASE("math_dapo compute_score equals Python's dict: score, acc, pred (null without a box)") {
  const auto ref = hyflow::test::load_reference("reward_reference.json");
  for (const auto& c : ref.at("compute_score")) {
    const auto solution = c.at("solution").get<std::string>();
    CAPTURE(solution, c.at("strict").get<bool>());
    const auto r = math_dapo::compute_score(solution, c.at("gt").get<std::string>(), c.at("strict").get<bool>());
    CHECK(r.score == c.at("score").get<double>());
    CHECK(r.extra_info.at("acc") == c.at("acc"));
    CHECK(r.extra_info.at("pred") == c.at("pred"));
  }
}

TEST_CASE("gsm8k extraction equals Python on multi-byte text") {
  const auto ref = hyflow::test::load_reference("reward_reference.json");
  for (const auto& c : ref.at("gsm8k")) {
    const auto solution = c.at("solution").get<std::string>();
    const auto method = c.at("method").get<std::string>();
    CAPTURE(solution, method);
    CHECK(gsm8k::extract_solution(solution, method) == opt_string(c.at("answer")));
  }
}

TEST_CASE("the issue's examples: \\fracπ2, NBSP, strict box without a box") {
  CHECK(math_dapo::normalize_final_answer("\\fracπ2") == "\\frac{π}{2}");
  CHECK(math_dapo::normalize_final_answer("\u00a042\u00a0") == "42");
  CHECK(math_dapo::is_correct_minerva("Answer:\u00a0\u00a07", "7").first);
  const auto r = math_dapo::compute_score("no box here", "7", /*strict_box_verify=*/true);
  CHECK(r.score == -1.0);
  CHECK(r.extra_info.at("pred").is_null());
  CHECK_FALSE(math_dapo::is_correct_strict_box("no box", "7").second.has_value());
  CHECK_THROWS_AS(math_dapo::is_correct_strict_box("x", "7", std::vector<int64_t>{1, 2}), hyflow::ValueError);
}

TEST_CASE("bytes that are not UTF-8 pass through normalisation unchanged") {
  const std::string broken = "7\xff\xc3";
  CHECK(math_dapo::normalize_final_answer(broken) == broken);
  CHECK(math_dapo::normalize_final_answer("\\frac\xff"
                                          "2") == "\\frac{\xff}{2}");
}
