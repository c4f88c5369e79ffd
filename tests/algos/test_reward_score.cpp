// Rule reward scorers, default_compute_score routing and the reward-function registry.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/reward_score.hpp>

#include <catch2/catch.hpp>

#include <string>

using namespace hyflow::algos::reward_score;
using Json = nlohmann::json;

TEST_CASE("gsm8k strict takes the last '#### n' and drops commas") {
  REQUIRE(gsm8k::extract_solution("so 3+4 = 7\n#### 1,234") == std::optional<std::string>("1234"));
  REQUIRE(gsm8k::extract_solution("#### 72 then #### -73.5") == std::optional<std::string>("-73.5"));
  REQUIRE_FALSE(gsm8k::extract_solution("the answer is 72"));
  REQUIRE(gsm8k::compute_score("#### 1,234", "1234") == 1.0);
  REQUIRE(gsm8k::compute_score("#### 12", "1234") == 0.0);
  REQUIRE(gsm8k::compute_score("#### 12", "1234", "strict", 0.1) == 0.1);
  REQUIRE(gsm8k::compute_score("no marker 1234", "1234") == 0.0);
}

TEST_CASE("gsm8k only looks at the last 300 characters") {
  const std::string early = "#### 5" + std::string(400, ' ');
  REQUIRE(gsm8k::compute_score(early, "5") == 0.0);
  REQUIRE(gsm8k::compute_score(std::string(400, ' ') + "#### 5", "5") == 1.0);
}

TEST_CASE("gsm8k flexible takes the last number-like token that is not '.'") {
  REQUIRE(gsm8k::extract_solution("I think 3 then 42", "flexible") == std::optional<std::string>("42"));
  REQUIRE(gsm8k::extract_solution("5 and .", "flexible") == std::optional<std::string>("5"));
  REQUIRE(gsm8k::extract_solution("it is 42.", "flexible") == std::optional<std::string>("42."));
  REQUIRE(gsm8k::extract_solution(". .", "flexible") == std::optional<std::string>("."));
  REQUIRE_FALSE(gsm8k::extract_solution("none", "flexible"));
  REQUIRE(gsm8k::compute_score("I think 3 then 42", "42", "flexible") == 1.0);
  REQUIRE_THROWS_AS(gsm8k::extract_solution("#### 1", "lenient"), hyflow::ValueError);
}

TEST_CASE("math: last boxed expression, \\boxed<space> and \\fbox forms") {
  REQUIRE(math::last_boxed_only_string("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") ==
          std::optional<std::string>("\\boxed{\\frac{1}{2}}"));
  REQUIRE(math::last_boxed_only_string("so $\\boxed 5$.") == std::optional<std::string>("\\boxed 5"));
  REQUIRE(math::last_boxed_only_string("\\fbox{7}") == std::optional<std::string>("\\fbox{7}"));
  REQUIRE_FALSE(math::last_boxed_only_string("\\boxed{unbalanced"));
  REQUIRE_FALSE(math::last_boxed_only_string("nothing"));
  REQUIRE(math::remove_boxed("\\boxed{x^{2}}") == "x^{2}");
  REQUIRE(math::remove_boxed("\\boxed 5") == "5");
  REQUIRE_THROWS_AS(math::remove_boxed("\\fbox{7}"), hyflow::ValueError);
}

TEST_CASE("math strip_string normalises fractions, roots, units, percents, degrees") {
  REQUIRE(math::strip_string("\\dfrac{1}{2}") == "\\frac{1}{2}");
  REQUIRE(math::strip_string("0.5") == "\\frac{1}{2}");
  REQUIRE(math::strip_string(".5") == "\\frac{1}{2}");
  REQUIRE(math::strip_string("1/2") == "\\frac{1}{2}");
  REQUIRE(math::strip_string("01/2") == "01/2");  // not a canonical integer
  REQUIRE(math::strip_string("\\frac12") == "\\frac{1}{2}");
  REQUIRE(math::strip_string("\\frac1{72}") == "\\frac{1}{72}");
  REQUIRE(math::strip_string("\\sqrt3") == "\\sqrt{3}");
  REQUIRE(math::strip_string("x = 5") == "5");
  REQUIRE(math::strip_string("abc = 5") == "abc=5");
  REQUIRE(math::strip_string("10\\%") == "10");
  REQUIRE(math::strip_string("5\\text{ cm}") == "5");
  REQUIRE(math::strip_string("90^\\circ") == "90");
  REQUIRE(math::strip_string("\\left( 1, 2 \\right)") == "(1,2)");
  REQUIRE(math::strip_string("\\$3") == "3");
  REQUIRE(math::strip_string("") == "");
  REQUIRE_THROWS_AS(math::strip_string("\\text{ a}\\text{ b}"), hyflow::ValueError);
  REQUIRE_THROWS_AS(math::strip_string("2\\sqrt"), hyflow::ValueError);
}

TEST_CASE("math is_equiv falls back to raw equality when normalising fails") {
  REQUIRE(math::is_equiv(std::string("\\frac12"), std::string("0.5")));
  REQUIRE(math::is_equiv(std::string("\\text{ a}\\text{ b}"), std::string("\\text{ a}\\text{ b}")));
  REQUIRE_FALSE(math::is_equiv(std::string("\\text{ a}\\text{ b}"), std::string("a")));
  REQUIRE(math::is_equiv(std::nullopt, std::nullopt));
  REQUIRE_FALSE(math::is_equiv(std::string("1"), std::nullopt));
}

TEST_CASE("math compute_score: 1 for an equivalent boxed answer, 0 otherwise") {
  REQUIRE(math::compute_score("so the answer is \\boxed{\\dfrac{1}{2}}.", "\\frac12") == 1.0);
  REQUIRE(math::compute_score("\\boxed{3} ... \\boxed{4}", "3") == 0.0);
  REQUIRE(math::compute_score("\\fbox{3}", "3") == 0.0);  // remove_boxed rejects \fbox, as in verl
  REQUIRE(math::compute_score("3", "3") == 0.0);
}

TEST_CASE("math_dapo normalize_final_answer by hand") {
  REQUIRE(math_dapo::normalize_final_answer("x = \\boxed{10}") == "10");
  REQUIRE(math_dapo::normalize_final_answer("1,000") == "1000");
  REQUIRE(math_dapo::normalize_final_answer("5 dollars") == "5");
  REQUIRE(math_dapo::normalize_final_answer("\\text{5 dollars}") == "5");
  REQUIRE(math_dapo::normalize_final_answer("\\frac12") == "\\frac{1}{2}");
  REQUIRE(math_dapo::normalize_final_answer("\\sqrt2") == "\\sqrt{2}");
  REQUIRE(math_dapo::normalize_final_answer("The answer is $x^2$ here") == "x^2");
  REQUIRE(math_dapo::normalize_final_answer("90^\\circ") == "90");
  REQUIRE(math_dapo::normalize_final_answer("  7  ") == "7");
}

TEST_CASE("math_dapo compute_score: last 'Answer:' line, ±1 with acc and pred") {
  auto right = math_dapo::compute_score("work...\nAnswer: 42", "42");
  REQUIRE(right.score == 1.0);
  REQUIRE(right.extra_info.at("acc") == true);
  REQUIRE(right.extra_info.at("pred") == "42");
  auto wrong = math_dapo::compute_score("answer: 41\nmore text", "42");
  REQUIRE(wrong.score == -1.0);
  REQUIRE(wrong.extra_info.at("acc") == false);
  REQUIRE(wrong.extra_info.at("pred") == "41");
  REQUIRE(math_dapo::compute_score("Answer: 1\nAnswer: 2", "2").score == 1.0);
  REQUIRE(math_dapo::compute_score("no final line", "2").extra_info.at("pred") == "[INVALID]");
  REQUIRE(math_dapo::compute_score("so \\boxed{42}", "42", true).score == 1.0);
  REQUIRE(math_dapo::compute_score("so \\boxed{42.0}", "42", true).score == -1.0);
  REQUIRE(math_dapo::compute_score("so 42", "42", true).extra_info.at("pred").is_null());
  REQUIRE(math_dapo::is_correct_minerva("Answer: 3", "\\boxed{3}", true).first);
}

TEST_CASE("arithmetic scorer compares the last number with the ground truth") {
  REQUIRE(arithmetic::extract_answer("12+30=42") == std::optional<std::string>("42"));
  REQUIRE(arithmetic::compute_score("The sum is 1,042.", "1042") == 1.0);
  REQUIRE(arithmetic::compute_score("-5", "-5") == 1.0);
  REQUIRE(arithmetic::compute_score("0.30", "0.3") == 1.0);
  REQUIRE(arithmetic::compute_score("41", "42") == 0.0);
  REQUIRE(arithmetic::compute_score("no idea", "42") == 0.0);
  REQUIRE_THROWS_AS(arithmetic::compute_score("4", "four"), hyflow::ValueError);
}

TEST_CASE("countdown: numbers used exactly once, expression hits the target") {
  const Json gt = {{"target", 24}, {"numbers", {4, 6, 1}}};
  REQUIRE(countdown::compute_score("<answer>4*6*1</answer>", gt) == 1.0);
  REQUIRE(countdown::compute_score("<answer> (4 * 6) / 1 </answer>", gt) == 1.0);
  REQUIRE(countdown::compute_score("<answer>4*6</answer>", gt) == Approx(0.1));  // 1 unused
  REQUIRE(countdown::compute_score("<answer>(4+6)*1</answer>", gt) == Approx(0.1));  // 10
  REQUIRE(countdown::compute_score("<answer>x</answer> then <answer>4*6*1</answer>", gt) == 1.0);
  REQUIRE(countdown::compute_score("24", gt) == 0.0);
  REQUIRE(countdown::compute_score("<answer>4*6*1</answer>", Json(gt.dump())) == 1.0);
  REQUIRE_THROWS_AS(countdown::compute_score("<answer>1</answer>", Json{{"target", 1}}), hyflow::ValueError);
}

TEST_CASE("countdown evaluator: arithmetic only, no power, no division by zero") {
  REQUIRE(countdown::evaluate_equation("(1+2)*3") == std::optional<double>(9.0));
  REQUIRE(countdown::evaluate_equation("-3 + 10 / 4") == std::optional<double>(-0.5));
  REQUIRE_FALSE(countdown::evaluate_equation("2**3"));
  REQUIRE_FALSE(countdown::evaluate_equation("1/0"));
  REQUIRE_FALSE(countdown::evaluate_equation("1+a"));
  REQUIRE_FALSE(countdown::evaluate_equation("(1+2"));
  REQUIRE_FALSE(countdown::evaluate_equation(std::string(1000, '(') + "1" + std::string(1000, ')')));
  REQUIRE(countdown::validate_equation("10 - 3*3", {3, 10, 3}));
  REQUIRE_FALSE(countdown::validate_equation("10 - 3", {3, 10, 3}));
}

TEST_CASE("char_count: exact match of the last boxed answer, as verl-recipe char_count") {
  const std::string cot = "s != r.\nr = r.\na != r.\n";
  REQUIRE(char_count::extract_answer(cot + "\\boxed{1} r in s-r-a.") == std::optional<std::string>("1"));
  REQUIRE(char_count::compute_score(cot + "\\boxed{1} r in s-r-a.", "1") == 1.0);
  REQUIRE(char_count::compute_score("\\boxed{2} then \\boxed{1}", "1") == 1.0);  // the last box counts
  REQUIRE(char_count::compute_score("\\boxed{1} then \\boxed{2}", "1") == 0.0);
  REQUIRE(char_count::compute_score("\\boxed{ 1}", "1") == 0.0);  // no normalisation
  REQUIRE(char_count::compute_score("\\boxed{01}", "1") == 0.0);
  REQUIRE(char_count::compute_score("\\boxed 1$", "1") == 1.0);  // verl's "\boxed " form
  REQUIRE(char_count::compute_score("\\fbox{1}", "1") == 0.0);   // remove_boxed rejects it: verl scores 0
  REQUIRE(char_count::compute_score("the answer is 1", "1") == 0.0);
  REQUIRE_FALSE(char_count::extract_answer("no answer"));
}

TEST_CASE("char_count: the built-in task's <answer> tags box the answer when there is no \\boxed") {
  REQUIRE(char_count::compute_score("s != r.\nr = r.\n<answer>1</answer>", "1") == 1.0);
  REQUIRE(char_count::compute_score("<answer>3</answer><answer>1</answer>", "1") == 1.0);  // the last tags
  REQUIRE(char_count::compute_score("<answer>1</answer><answer>3</answer>", "1") == 0.0);
  REQUIRE(char_count::compute_score("<answer>1", "1") == 0.0);  // unclosed
  REQUIRE(char_count::compute_score("<answer>1 </answer>", "1") == 0.0);
  REQUIRE(char_count::compute_score("<answer>1</answer> \\boxed{2}", "1") == 0.0);  // a box takes precedence
  REQUIRE(char_count::extract_answer("<answer></answer>") == std::optional<std::string>(""));
}

TEST_CASE("default_compute_score routes by data_source and names unknown ones") {
  REQUIRE(default_compute_score("openai/gsm8k", "#### 7", "7").score == 1.0);
  // verl's names in extra_info are data, not options: "method" is ignored, as in verl
  REQUIRE(default_compute_score("openai/gsm8k", "so 7", "7", Json{{"method", "flexible"}}).score == 0.0);
  REQUIRE(default_compute_score("openai/gsm8k", "so 7", "7", Json{{"hyflow_gsm8k_method", "flexible"}}).score == 1.0);
  REQUIRE_THROWS_AS(default_compute_score("openai/gsm8k", "#### 7", "7", Json{{"hyflow_gsm8k_method", 1}}),
                    hyflow::ValueError);
  REQUIRE(default_compute_score("lighteval/MATH", "\\boxed{7}", "7").score == 1.0);
  REQUIRE(default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{7}", "8").score == 0.0);
  auto dapo = default_compute_score("aime2024", "Answer: 7", "7");
  REQUIRE(dapo.score == 1.0);
  REQUIRE(dapo.extra_info.at("acc") == true);
  REQUIRE(default_compute_score("math_dapo", "Answer: 6", "7").score == -1.0);
  REQUIRE(default_compute_score("arithmetic", "3+4=7", 7).score == 1.0);
  REQUIRE(default_compute_score("countdown", "<answer>3+4</answer>", Json{{"target", 7}, {"numbers", {3, 4}}})
              .score == 1.0);
  REQUIRE(default_compute_score("char_count", "a = a.\n<answer>1</answer>", "1").score == 1.0);
  REQUIRE(default_compute_score("char_count", "\\boxed{2}", 2).score == 1.0);  // a number as ground truth
  REQUIRE(default_compute_score("char_count", "\\boxed{2}", "1").score == 0.0);
  REQUIRE_THROWS_AS(default_compute_score("char_count", "\\boxed{2}", Json::array()), hyflow::ValueError);
  REQUIRE_THROWS_AS(default_compute_score("my/dataset", "x", "y"), hyflow::KeyError);
  REQUIRE_THROWS_WITH(default_compute_score("my/dataset", "x", "y"), Catch::Contains("my/dataset"));
  REQUIRE_THROWS_WITH(default_compute_score("numina_olympiads", "x", "y"), Catch::Contains("numina_olympiads"));
  REQUIRE_THROWS_AS(default_compute_score("openai/gsm8k", "#### 7", Json::array()), hyflow::ValueError);
}

TEST_CASE("reward function registry: default, custom functions, duplicates, unknown names") {
  REQUIRE(get_compute_score("default")("openai/gsm8k", "#### 7", "7", Json()).score == 1.0);
  register_compute_score("test_length", [](const std::string&, const std::string& solution, const Json&, const Json&) {
    return ScoreResult{static_cast<double>(solution.size())};
  });
  REQUIRE(get_compute_score("test_length")("any", "abcd", Json(), Json()).score == 4.0);
  REQUIRE_THROWS_AS(register_compute_score("test_length",
                                           [](const std::string&, const std::string&, const Json&, const Json&) {
                                             return ScoreResult{};
                                           }),
                    hyflow::ValueError);
  REQUIRE_THROWS_AS(get_compute_score("nope"), hyflow::KeyError);
  REQUIRE_THROWS_WITH(get_compute_score("nope"), Catch::Contains("nope"));
}

TEST_CASE("scorers stay bounded on very long responses") {
  const std::string noise(200000, '7');
  REQUIRE(arithmetic::compute_score(noise + " so the answer is 42", "42") == 1.0);
  REQUIRE(countdown::compute_score("<answer>" + noise + "</answer>", Json{{"target", 1}, {"numbers", {1}}}) ==
          Approx(0.1));
  REQUIRE_FALSE(countdown::evaluate_equation(std::string(200000, '1') + "+"));
  REQUIRE(math::compute_score("\\boxed{" + noise + "}", noise) == 1.0);
  REQUIRE(math_dapo::compute_score(noise + "\nAnswer: 5", "5").score == 1.0);
  REQUIRE(gsm8k::compute_score(noise + " #### 5", "5") == 1.0);
}

TEST_CASE("numbers too large for a double never throw") {
  const std::string huge(400, '9');
  REQUIRE(arithmetic::compute_score(huge.substr(0, 299), "42") == 0.0);
  REQUIRE(countdown::evaluate_equation(huge) == std::optional<double>(HUGE_VAL));
  REQUIRE(countdown::compute_score("<answer>" + huge + "</answer>", Json{{"target", 1}, {"numbers", {1}}}) ==
          Approx(0.1));
}
