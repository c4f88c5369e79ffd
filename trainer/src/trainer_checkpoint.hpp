#pragma once
// The checkpoint folder layout of the trainer (verl's): <root>/global_step_N/{actor,critic,data.json}
// and <root>/latest_checkpointed_iteration.txt. A step's folder is written as global_step_N.tmp
// and renamed when complete, so it appears whole or not at all; data.json holds the trainer's
// own state (global_step, data position, KL coefficient, replay buffer).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace hyflow::trainer {

/// Writes the checkpoint of `step` under `root`: `write_roles(tmp_dir)` saves the workers' parts
/// into the temporary folder, `state` becomes data.json, then the folder is renamed into place
/// and the tracker file updated. With `keep`, only the newest `keep` step folders remain.
void save_checkpoint_folder(const std::filesystem::path& root, int64_t step,
                            const std::function<void(const std::filesystem::path& dir)>& write_roles,
                            const nlohmann::json& state, std::optional<int64_t> keep);

/// The folder to resume from for trainer.resume_mode (disable | auto | resume_path): null for
/// disable, and for auto without a tracker file. FormatError naming an unreadable tracker.
std::optional<std::filesystem::path> resume_folder(const std::string& resume_mode, const std::filesystem::path& root,
                                                   const std::optional<std::string>& resume_from_path);

/// N of a folder named global_step_N; ValueError naming the folder otherwise.
int64_t checkpoint_step(const std::filesystem::path& dir);

/// data.json of a checkpoint: a JSON object whose global_step is `step` (FormatError naming the
/// file otherwise).
nlohmann::json read_trainer_state(const std::filesystem::path& file, int64_t step);

}  // namespace hyflow::trainer
