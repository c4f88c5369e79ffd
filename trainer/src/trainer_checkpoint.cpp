#include "trainer_checkpoint.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/core/files.hpp>

#include <algorithm>
#include <fstream>
#include <vector>

namespace hyflow::trainer {

namespace fs = std::filesystem;

int64_t checkpoint_step(const fs::path& dir) {
  const std::string name = dir.filename().string();
  const std::string prefix = "global_step_";
  if (name.rfind(prefix, 0) != 0)
    throw ValueError("checkpoint folder '" + dir.string() + "' is not named global_step_N");
  try {
    size_t used = 0;
    const int64_t n = std::stoll(name.substr(prefix.size()), &used);
    if (used != name.size() - prefix.size()) throw std::invalid_argument(name);
    return n;
  } catch (const std::exception&) {
    throw ValueError("checkpoint folder '" + dir.string() + "' is not named global_step_N");
  }
}

void save_checkpoint_folder(const fs::path& root, int64_t step, const std::function<void(const fs::path&)>& write_roles,
                            const nlohmann::json& state, std::optional<int64_t> keep) {
  fs::create_directories(root);
  const fs::path final_dir = root / ("global_step_" + std::to_string(step));
  const fs::path tmp = root / ("global_step_" + std::to_string(step) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_roles(tmp);
  write_text_atomically(tmp / "data.json", state.dump(2));
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);  // the folder appears complete or not at all
  write_text_atomically(root / "latest_checkpointed_iteration.txt", std::to_string(step));
  if (!keep) return;
  std::vector<std::pair<int64_t, fs::path>> dirs;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("global_step_", 0) == 0 && name.find(".tmp") == std::string::npos)
      dirs.emplace_back(checkpoint_step(e.path()), e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; i + static_cast<size_t>(*keep) < dirs.size(); ++i) fs::remove_all(dirs[i].second);
}

std::optional<fs::path> resume_folder(const std::string& resume_mode, const fs::path& root,
                                      const std::optional<std::string>& resume_from_path) {
  if (resume_mode == "disable") return std::nullopt;
  if (resume_mode == "resume_path") {
    if (!resume_from_path)
      throw ValueError("config key 'trainer.resume_from_path' is required with resume_mode=resume_path");
    return fs::path(*resume_from_path);
  }
  if (resume_mode != "auto")
    throw ValueError("config key 'trainer.resume_mode': unknown mode '" + resume_mode +
                     "' (disable, auto, resume_path)");
  const fs::path tracker = root / "latest_checkpointed_iteration.txt";
  if (!fs::exists(tracker)) return std::nullopt;
  std::ifstream in(tracker);
  int64_t step = 0;
  if (!(in >> step)) throw FormatError("unreadable checkpoint tracker " + tracker.string());
  return root / ("global_step_" + std::to_string(step));
}

nlohmann::json read_trainer_state(const fs::path& file, int64_t step) {
  std::ifstream in(file);
  if (!in) throw FormatError("checkpoint trainer state " + file.string() + " is missing");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("checkpoint trainer state " + file.string() + " is not valid JSON: " + e.what());
  }
  if (!state.is_object() || !state.contains("global_step") || !state.at("global_step").is_number_integer())
    throw FormatError("checkpoint trainer state " + file.string() + " has no integer global_step");
  if (state.at("global_step").get<int64_t>() != step)
    throw FormatError("checkpoint trainer state " + file.string() + " says global_step " +
                      state.at("global_step").dump() + ", its folder says " + std::to_string(step));
  return state;
}

}  // namespace hyflow::trainer
