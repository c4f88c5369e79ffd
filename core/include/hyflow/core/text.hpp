#pragma once
// ASCII text helpers for parsers of config values and protocol headers.

#include <string>

namespace hyflow {

/// `s` with ASCII letters lowered.
std::string ascii_lower(std::string s);

/// `s` without leading and trailing spaces, tabs, carriage returns and newlines.
std::string trim(const std::string& s);

}  // namespace hyflow
