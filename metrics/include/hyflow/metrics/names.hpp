#pragma once
// Prometheus' rules for names, and the escaping of the text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hyflow::metrics {

/// A series' labels, name -> value, in the order given (the exposition keeps it).
using Labels = std::vector<std::pair<std::string, std::string>>;

/// The same label names with the same values, in any order.
bool same_label_set(const Labels& a, const Labels& b);

/// [a-zA-Z_:][a-zA-Z0-9_:]*
bool valid_metric_name(std::string_view name);
/// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved for Prometheus' own use).
bool valid_label_name(std::string_view name);
/// ValueError naming the metric when the name is invalid.
void check_metric_name(std::string_view name);
/// ValueError naming the metric and the label for an invalid or repeated label name.
void check_labels(std::string_view metric, const Labels& labels);

/// A label value as written between the quotes: \ -> \\, " -> \", newline -> \n.
std::string escape_label_value(std::string_view value);
/// A HELP text: \ -> \\, newline -> \n.
std::string escape_help(std::string_view help);
/// A sample value: the shortest text that reads back as the same double; NaN, +Inf, -Inf.
std::string format_value(double value);

}  // namespace hyflow::metrics
