// Prometheus' name rules and the escaping of the text exposition format 0.0.4.
#include <hyflow/core/error.hpp>
#include <hyflow/metrics/names.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

namespace hyflow::metrics {
namespace {

bool name_start(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}
bool name_char(char c, bool colon) {
  return name_start(c, colon) || (c >= '0' && c <= '9');
}

bool valid_name(std::string_view name, bool colon) {
  if (name.empty() || !name_start(name[0], colon)) return false;
  for (char c : name)
    if (!name_char(c, colon)) return false;
  return true;
}

}  // namespace

bool same_label_set(const Labels& a, const Labels& b) {
  if (a.size() != b.size()) return false;
  for (const auto& l : a)
    if (std::find(b.begin(), b.end(), l) == b.end()) return false;
  return true;
}

bool valid_metric_name(std::string_view name) {
  return valid_name(name, /*colon=*/true);
}

bool valid_label_name(std::string_view name) {
  return valid_name(name, /*colon=*/false) && name.substr(0, 2) != "__";
}

void check_metric_name(std::string_view name) {
  if (!valid_metric_name(name))
    throw ValueError("invalid Prometheus metric name '" + std::string(name) + "' (allowed: [a-zA-Z_:][a-zA-Z0-9_:]*)");
}

void check_labels(std::string_view metric, const Labels& labels) {
  std::set<std::string_view> seen;
  for (const auto& [name, value] : labels) {
    if (!valid_label_name(name))
      throw ValueError("metric '" + std::string(metric) + "': invalid label name '" + name +
                       "' (allowed: [a-zA-Z_][a-zA-Z0-9_]*, not starting with __)");
    if (!seen.insert(name).second)
      throw ValueError("metric '" + std::string(metric) + "': label '" + name + "' given twice");
  }
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);  // shortest round trip
  return std::string(buf, end);
}

}  // namespace hyflow::metrics
