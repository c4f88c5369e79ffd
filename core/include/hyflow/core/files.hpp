#pragma once
// Small file helpers the trackers and the trainer share: never overwrite what an earlier run left,
// and replace a file so that a reader sees the old text or the new one, never half of it.

#include <filesystem>
#include <string>

namespace hyflow {

/// The first of `<path><suffix>`, `<path><suffix>.1`, `<path><suffix>.2`, ... that does not exist.
std::filesystem::path free_path(const std::filesystem::path& path, const std::string& suffix);

/// Writes `text` to `<path>.tmp` and renames it over `path`. hyflow::Error naming the file when
/// the write fails.
void write_text_atomically(const std::filesystem::path& path, const std::string& text);

}  // namespace hyflow
