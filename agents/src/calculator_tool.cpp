#include <hyflow/agents/calculator_tool.hpp>
#include <hyflow/core/error.hpp>

#include <boost/multiprecision/cpp_int.hpp>

#include <cctype>
#include <mutex>

namespace hyflow::agents {
namespace {

using Rational = boost::multiprecision::cpp_rational;
using Integer = boost::multiprecision::cpp_int;

constexpr int kMaxNesting = 100;

// expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ;
// unary := '-' unary | '+' unary | primary ; primary := digits | '(' expr ')'
class Parser {
 public:
  Parser(const std::string& text, const CalculatorLimits& limits) : s_(text), limits_(limits) {}

  Rational parse() {
    Rational value = expr();
    skip_space();
    if (pos_ != s_.size()) fail("unexpected '" + std::string(1, s_[pos_]) + "'");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ValueError(what + " at offset " + std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void check_size(const Rational& v) {
    auto digits = [](const Integer& i) { return i.str().size(); };
    if (digits(boost::multiprecision::numerator(v)) > limits_.max_result_digits ||
        digits(boost::multiprecision::denominator(v)) > limits_.max_result_digits)
      fail("a value has more than " + std::to_string(limits_.max_result_digits) + " digits");
  }
  Rational expr() {
    Rational v = term();
    for (;;) {
      if (eat('+')) {
        v += term();
      } else if (eat('-')) {
        v -= term();
      } else {
        return v;
      }
      check_size(v);
    }
  }
  Rational term() {
    Rational v = unary();
    for (;;) {
      if (eat('*')) {
        v *= unary();
      } else if (eat('/')) {
        const size_t at = pos_;
        Rational d = unary();
        if (d == 0) {
          pos_ = at;
          fail("division by zero");
        }
        v /= d;
      } else {
        return v;
      }
      check_size(v);
    }
  }
  Rational unary() {
    if (eat('-')) return nested([this] { return Rational(-unary()); });
    if (eat('+')) return nested([this] { return unary(); });
    return primary();
  }
  template <class F>
  Rational nested(F f) {
    if (++depth_ > kMaxNesting) fail("nesting deeper than " + std::to_string(kMaxNesting));
    Rational v = f();
    --depth_;
    return v;
  }
  Rational primary() {
    skip_space();
    if (pos_ >= s_.size()) fail("expected a number or '(' but the expression ended");
    if (s_[pos_] == '(') {
      ++pos_;
      Rational v = nested([this] { return expr(); });
      if (!eat(')')) fail("expected ')'");
      return v;
    }
    const size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == start) fail("expected a number or '(' but found '" + std::string(1, s_[pos_]) + "'");
    return Rational(Integer(s_.substr(start, pos_ - start)));
  }

  const std::string& s_;
  const CalculatorLimits& limits_;
  size_t pos_ = 0;
  int depth_ = 0;
};

size_t limit_of(const nlohmann::json& config, const char* key, size_t fallback) {
  if (!config.contains(key)) return fallback;
  const auto& v = config.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < 1)
    throw ValueError(std::string(kCalculatorToolClass) + " config." + key + ": expected a positive integer, got " +
                     v.dump());
  return v.get<size_t>();
}

class CalculatorTool final : public Tool {
 public:
  CalculatorTool(ToolSchema schema, CalculatorLimits limits) : Tool(std::move(schema)), limits_(limits) {}

  ToolResult execute(const std::string&, const nlohmann::json& arguments) override {
    auto it = arguments.is_object() ? arguments.find("expression") : arguments.end();
    if (it == arguments.end() || !it->is_string())
      return {.text = "Error: the arguments need a string \"expression\"", .status = ToolStatus::error};
    try {
      return {.text = calculate(it->get<std::string>(), limits_)};
    } catch (const ValueError& e) {
      return {.text = std::string("Error: ") + e.what(), .status = ToolStatus::error};
    }
  }

 private:
  CalculatorLimits limits_;
};

}  // namespace

std::string calculate(const std::string& expression, const CalculatorLimits& limits) {
  if (expression.size() > limits.max_expression_chars)
    throw ValueError("the expression is longer than " + std::to_string(limits.max_expression_chars) + " characters");
  const Rational v = Parser(expression, limits).parse();
  const Integer& den = boost::multiprecision::denominator(v);
  if (den == 1) return boost::multiprecision::numerator(v).str();
  return boost::multiprecision::numerator(v).str() + "/" + den.str();
}

ToolSchema calculator_schema() {
  return ToolSchema{
      .name = "calculator",
      .description = "Exact arithmetic: + - * / and parentheses on integers of any size.",
      .parameters = {{"type", "object"},
                     {"properties", {{"expression", {{"type", "string"}, {"description", "e.g. (1234*5678)-9"}}}}},
                     {"required", {"expression"}}}};
}

void register_calculator_tool() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_tool(kCalculatorToolClass, [](const nlohmann::json& config, ToolSchema schema) {
      CalculatorLimits limits;
      limits.max_expression_chars = limit_of(config, "max_expression_chars", limits.max_expression_chars);
      limits.max_result_digits = limit_of(config, "max_result_digits", limits.max_result_digits);
      return std::make_unique<CalculatorTool>(std::move(schema), limits);
    });
  });
}

}  // namespace hyflow::agents
