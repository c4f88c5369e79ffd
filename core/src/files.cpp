#include <hyflow/core/error.hpp>
#include <hyflow/core/files.hpp>

#include <fstream>

namespace hyflow {

namespace fs = std::filesystem;

fs::path free_path(const fs::path& path, const std::string& suffix) {
  fs::path target = path.string() + suffix;
  for (int n = 1; fs::exists(target); ++n) target = path.string() + suffix + "." + std::to_string(n);
  return target;
}

void write_text_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) throw Error("cannot write " + tmp.string());
  }
  fs::rename(tmp, path);
}

}  // namespace hyflow
