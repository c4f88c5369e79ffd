#pragma once
// Trainer configuration with verl's key names: a table of known keys with types, defaults and
// bounds (the trainer's own sections plus the role workers' declarations, each key declared
// once), INI files ("[actor_rollout_ref.actor]" sections) and "--key=value" overrides read by
// Boost.ProgramOptions, and the resulting JSON tree whose subtrees are handed to the workers.
// Unknown keys (with the closest known key suggested), values of the wrong type, non-finite
// numbers, values below a key's minimum and a key given twice in one INI file are
// hyflow::KeyError / ValueError naming the key.

#include <hyflow/core/config_key.hpp>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace hyflow::trainer {

using Json = nlohmann::json;

// KeyType and ConfigKey: hyflow/core/config_key.hpp.

/// Which key table a program uses.
enum class ConfigSchema { ppo, sft };

/// The keys of a schema with verl's defaults (PPO: verl-reference §6 plus hyflow's
/// data.synthetic.* and trainer.metrics_file, with workers::worker_config_keys for the
/// actor_rollout_ref, critic and reward_model sections; SFT: verl's sft_trainer keys).
const std::vector<ConfigKey>& config_keys(ConfigSchema schema);

/// Where the value of a key came from; the run folder marks every key with it (docs/observing.md).
struct KeySource {
  enum class Kind { key_default, program, file, command_line };
  Kind kind = Kind::key_default;
  std::string file;  ///< the INI file, for Kind::file
  /// "default", "program", "file <path>", "command line".
  std::string describe() const;
};

class Config {
 public:
  explicit Config(ConfigSchema schema = ConfigSchema::ppo);

  /// Reads an INI file; each "key = value" inside "[section]" sets "section.key" (source: the file).
  /// Unknown keys: KeyError naming the key and the file; bad values: ValueError.
  void load_ini(const std::string& path);
  /// "--key=value" (or "--key value") arguments (source: the command line); "--config=<ini>" loads
  /// a file first. Returns true when "--help" was given.
  bool apply_arguments(const std::vector<std::string>& args);
  /// Sets one key from its text form (parsed by the key's type); source: the program.
  void set(const std::string& key, const std::string& text);
  /// Sets one key from JSON (checked against the key's type); source: the program.
  void set_json(const std::string& key, const Json& value);

  /// The value of a key (KeyError if unknown).
  const Json& get(const std::string& key) const;
  /// Where the value of a key came from: the last of default, program, file and command line that
  /// set it, even to the default's value (KeyError if unknown).
  const KeySource& source(const std::string& key) const;
  /// The key names in table order.
  std::vector<std::string> keys() const;
  bool is_null(const std::string& key) const { return get(key).is_null(); }
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;

  /// Nested JSON of every key ("a.b.c" -> {"a": {"b": {"c": v}}}); drop_nulls leaves out
  /// keys whose value is null (workers take an absent key as verl's null).
  Json tree(bool drop_nulls = false) const;
  /// The subtree under a dotted prefix ("actor_rollout_ref").
  Json subtree(const std::string& prefix, bool drop_nulls = true) const;

  /// "--key=default  help" lines, one per key.
  std::string help_text() const;
  ConfigSchema schema() const { return schema_; }

 private:
  struct Value {
    std::string name;
    Json value;
    KeySource source;
  };
  const ConfigKey& key_info(const std::string& key) const;
  void assign(const std::string& key, const Json& value, KeySource source);
  ConfigSchema schema_;
  std::vector<Value> values_;  // in table order
};

/// Parses text for a key type; ValueError naming `key` on a bad value.
Json parse_config_value(const ConfigKey& key, const std::string& text);

}  // namespace hyflow::trainer
