#pragma once
// One key of a config schema: dotted name, value type, default, help line and bounds. The
// sections of verl's config are declared once, where they are read (the role workers declare
// actor_rollout_ref.*, critic.*, reward_model.*; the trainer the rest), and the trainer's key
// table, `--help` and parsing are built from these declarations.

#include <nlohmann/json.hpp>

#include <string>

namespace hyflow {

/// Value kinds a key accepts. Nullable keys also take "null" / "none" / "~".
enum class KeyType { integer, number, boolean, string, list };

struct ConfigKey {
  std::string name;  ///< full dotted name ("actor_rollout_ref.rollout.min_p")
  KeyType type;
  nlohmann::json default_value;  ///< may be null (then `nullable`)
  std::string help;
  bool nullable = false;
  /// Smallest value an integer or number key takes (null: no bound). Numbers must be finite.
  nlohmann::json minimum = nullptr;
};

/// "integer", "number", "boolean", "string", "list".
const char* to_string(KeyType type);

}  // namespace hyflow
