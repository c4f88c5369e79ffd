#pragma once
// The built-in exact calculator tool (class name "hyflow.tools.CalculatorTool"): + - * / and
// parentheses, unary minus, on integers of any size, evaluated as exact rationals. The answer
// is an integer when the value is whole, else a reduced fraction "p/q" (10/4 -> "5/2"). A bad
// expression or a division by zero is a ToolStatus::error whose text tells the model what was
// wrong. Arguments: {"expression": "<text>"}.

#include <hyflow/agents/tool.hpp>

#include <cstddef>
#include <string>

namespace hyflow::agents {

/// The registered class name.
inline constexpr const char* kCalculatorToolClass = "hyflow.tools.CalculatorTool";

/// Limits of one evaluation (a tool config's `config` keys of the same names).
struct CalculatorLimits {
  size_t max_expression_chars = 1000;  ///< longer expressions are an error
  size_t max_result_digits = 2000;     ///< a result (numerator or denominator) longer is an error
};

/// Evaluates `expression`; hyflow::ValueError naming the offending character offset, a
/// division by zero or an overlong expression or result.
std::string calculate(const std::string& expression, const CalculatorLimits& limits = {});

/// The tool's default OpenAI schema (function "calculator", one string parameter "expression").
ToolSchema calculator_schema();

/// Registers the calculator under kCalculatorToolClass (done at load; idempotent).
void register_calculator_tool();

}  // namespace hyflow::agents
