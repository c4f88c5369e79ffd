#pragma once
// Suggestions for misspelt names in error messages: "unknown config key 'data.train_batch'
// ...; did you mean 'data.train_batch_size'?".

#include <string>
#include <string_view>
#include <vector>

namespace hyflow {

/// Levenshtein distance (insertions, deletions, substitutions; bytes).
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate closest to `name`, or "" when none is close: within a third of the longer
/// name's length (at least 2 edits), or one of them contains the other's last dotted part.
std::string closest_name(std::string_view name, const std::vector<std::string>& candidates);

/// "; did you mean 'x'?" for the closest candidate, or "" when none is close.
std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates);

/// "a, b, c" (or "none").
std::string join_names(const std::vector<std::string>& names);

}  // namespace hyflow
