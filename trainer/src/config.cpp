// Key tables, INI/CLI parsing (Boost.ProgramOptions) and typed values of the trainer config.
// The PPO table is the trainer's own sections plus the role workers' declarations
// (workers::worker_config_keys), so a key is declared once, where it is read.
#include <hyflow/core/error.hpp>
#include <hyflow/core/suggest.hpp>
#include <hyflow/trainer/config.hpp>
#include <hyflow/workers/config.hpp>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

namespace hyflow::trainer {
namespace po = boost::program_options;

namespace {

using T = KeyType;
const Json kNull = Json();

ConfigKey key(std::string name, T type, Json def, std::string help, bool nullable = false, Json minimum = nullptr) {
  return ConfigKey{std::move(name), type, std::move(def), std::move(help), nullable, std::move(minimum)};
}
/// An integer key with a lower bound.
ConfigKey at_least(int64_t minimum, std::string name, Json def, std::string help, bool nullable = false) {
  return key(std::move(name), T::integer, std::move(def), std::move(help), nullable, minimum);
}

std::vector<ConfigKey> make_ppo_keys() {
  std::vector<ConfigKey> k = {
      key("data.train_files", T::string, "", "JSONL training file(s), comma separated; empty: data.synthetic"),
      key("data.val_files", T::string, "", "JSONL validation file(s); empty: data.synthetic"),
      key("data.prompt_key", T::string, "prompt", "column with the prompt (chat messages or text)"),
      key("data.reward_fn_key", T::string, "data_source", "column that selects the reward function"),
      at_least(1, "data.max_prompt_length", 512, "prompt tokens (left-padded)"),
      at_least(1, "data.max_response_length", 512, "response tokens"),
      at_least(1, "data.train_batch_size", 1024, "prompts per step"),
      at_least(1, "data.gen_batch_size", kNull,
               "prompts per generation batch with algorithm.filter_groups (null: data.train_batch_size)", true),
      at_least(1, "data.val_batch_size", kNull, "validation prompts per batch (null: all)", true),
      key("data.shuffle", T::boolean, true, "shuffle the training set every epoch"),
      key("data.seed", T::integer, kNull, "shuffle seed (null: 1)", true),
      key("data.truncation", T::string, "error", "error | left | right | middle"),
      key("data.filter_overlong_prompts", T::boolean, false, "drop prompts longer than max_prompt_length"),
      key("data.return_raw_chat", T::boolean, true, "accepted for verl compatibility"),
      at_least(0, "data.dataloader_num_workers", 8, "accepted for verl compatibility"),
      key("data.synthetic.task", T::string, "arithmetic", "built-in task when no files are given"),
      at_least(1, "data.synthetic.train_size", 2048, "built-in task: training prompts"),
      at_least(1, "data.synthetic.val_size", 128, "built-in task: validation prompts"),
      at_least(0, "data.synthetic.max_operand", 99, "built-in task: operands in [0, max_operand]"),
      key("data.synthetic.seed", T::integer, 0, "built-in task: generator seed"),
      key("actor_rollout_ref.hybrid_engine", T::boolean, true, "actor and rollout in one worker"),
      key("actor_rollout_ref.model.use_remove_padding", T::boolean, true, "accepted for verl compatibility"),
      key("actor_rollout_ref.actor.strategy", T::string, "fsdp", "accepted for verl compatibility"),
      key("actor_rollout_ref.actor.shuffle", T::boolean, false, "accepted for verl compatibility"),
  };
  std::vector<ConfigKey> rest = {
      key("actor_rollout_ref.rollout.name", T::string, "hf", "rollout engine (hyflow: hf)"),
      key("actor_rollout_ref.rollout.mode", T::string, "sync", "accepted for verl compatibility"),
      at_least(1, "actor_rollout_ref.rollout.nnodes", 1, "trainer.v1.trainer_mode=separate_async: rollout nodes"),
      at_least(1, "actor_rollout_ref.rollout.n_gpus_per_node", 1,
               "trainer.v1.trainer_mode=separate_async: rollout workers per node"),
      key("trainer.v1.trainer_mode", T::string, "sync",
          "sync (one colocated group) | colocate_async (the same group, the next batches generating while the "
          "controller scores and prepares) | separate_async (a rollout group of its own, generating ahead)"),
      at_least(1, "trainer.v1.colocate_async.num_warmup_batches", 1,
               "colocate_async: generation batches issued ahead of training (1: one-step-off)"),
      at_least(1, "trainer.v1.separate_async.num_warmup_batches", 1,
               "separate_async: generation batches in flight ahead of training (1: one-step-off)"),
      at_least(1, "trainer.v1.separate_async.parameter_sync_step", 1,
               "separate_async: publish the weights to the rollout group every N training steps (verl's default "
               "is 4; hyflow keeps 1, one-step-off)"),
      at_least(0, "trainer.v1.sampler.max_off_policy_threshold", 8,
               "colocate_async, separate_async: most weight versions a trajectory may lag the trained policy"),
      key("trainer.v1.sampler.max_off_policy_strategy", T::string, "drop",
          "async modes, beyond the threshold: drop (discard the prompt group) | wait (hold generation back)"),
      at_least(0, "trainer.v1.sampler.max_requeues", 0,
               "async modes with drop: generate a dropped prompt group again on newer weights, at most this often "
               "per prompt (0: dropped groups are used up)"),
      key("async_training.partial_rollout", T::boolean, false,
          "separate_async: generate in segments; a weight update between them continues the rows on the new "
          "version"),
      at_least(1, "async_training.partial_rollout_segments", 2,
               "separate_async with partial_rollout: segments a response is generated in"),
      key("critic.enable", T::boolean, kNull, "null: on for gae", true),
  };
  for (auto& o : rest) k.push_back(std::move(o));
  // actor_rollout_ref.*, critic.*, reward_model.*: declared by the role workers where they read them
  for (auto& o : workers::worker_config_keys()) k.push_back(std::move(o));
  std::vector<ConfigKey> tail = {
      key("reward_model.enable", T::boolean, false, "score with a reward model worker"),
      key("reward_model.reward_manager", T::string, "naive", "naive | dapo | batch"),
      key("reward_model.overlong_buffer.enable", T::boolean, false, "dapo: overlong penalty"),
      at_least(0, "reward_model.overlong_buffer.len", 0, "dapo: buffer length"),
      key("reward_model.overlong_buffer.penalty_factor", T::number, 1.0, "dapo: penalty factor", false, 0),
      key("custom_reward_function.path", T::string, kNull,
          "shared library whose static initializers register reward functions (null: built-in ones only)", true),
      key("custom_reward_function.name", T::string, "compute_score",
          "registered reward function (compute_score without a path: the default router)"),
      key("algorithm.adv_estimator", T::string, "gae", "advantage estimator"),
      key("algorithm.gamma", T::number, 1.0, "discount", false, 0),
      key("algorithm.lam", T::number, 1.0, "GAE lambda", false, 0),
      key("algorithm.norm_adv_by_std_in_grpo", T::boolean, true, "GRPO: divide by the group std"),
      key("algorithm.use_kl_in_reward", T::boolean, false, "KL penalty in the reward"),
      key("algorithm.kl_penalty", T::string, "kl", "KL estimator in the reward"),
      key("algorithm.kl_ctrl.type", T::string, "fixed", "fixed | adaptive"),
      key("algorithm.kl_ctrl.kl_coef", T::number, 0.001, "KL coefficient", false, 0),
      at_least(1, "algorithm.kl_ctrl.horizon", 10000, "adaptive horizon"),
      key("algorithm.kl_ctrl.target_kl", T::number, 0.1, "adaptive target", false, 0),
      key("algorithm.filter_groups.enable", T::boolean, false,
          "DAPO dynamic sampling: drop prompt groups whose metric is equal for all samples, regenerate until full"),
      key("algorithm.filter_groups.metric", T::string, kNull,
          "acc | score | seq_reward | seq_final_reward | another reward_extra_info column", true),
      key("algorithm.filter_groups.max_num_gen_batches", T::integer, 0,
          "generation batches allowed per step (0 or less: unlimited)"),
      key("algorithm.rollout_correction.rollout_is", T::string, kNull,
          "importance weights old/rollout policy: token | sequence (null: off; needs rollout.calculate_log_probs)",
          true),
      key("algorithm.rollout_correction.rollout_is_threshold", T::number, 2.0,
          "upper truncation of the rollout correction weights", false, 0),
      key("algorithm.rollout_correction.rollout_is_batch_normalize", T::boolean, false,
          "divide the truncated IS weights by their batch mean"),
      key("algorithm.rollout_correction.rollout_rs", T::string, kNull,
          "rejection sampling: token | sequence | geometric (null: off; needs rollout.calculate_log_probs)", true),
      key("algorithm.rollout_correction.rollout_rs_threshold", T::number, kNull,
          "rejection sampling: upper bound of the ratio (required with rollout_rs)", true, 0),
      key("algorithm.rollout_correction.rollout_rs_threshold_lower", T::number, kNull,
          "rejection sampling: lower bound of the ratio (null: 1 / rollout_rs_threshold)", true, 0),
      key("algorithm.rollout_correction.rollout_token_veto_threshold", T::number, kNull,
          "reject a whole response with any token ratio below this (null: off)", true, 0),
      key("algorithm.rollout_correction.bypass_mode", T::boolean, false,
          "use the rollout's log-probs as old_log_probs instead of recomputing them with the actor"),
      at_least(1, "trainer.total_epochs", 30, "epochs"),
      at_least(1, "trainer.total_training_steps", kNull, "null: epochs x batches", true),
      key("trainer.balance_batch", T::boolean, true,
          "reorder rows so data-parallel ranks get equal workloads (Karmarkar-Karp)"),
      key("trainer.project_name", T::string, "hyflow", "project"),
      key("trainer.experiment_name", T::string, "run", "experiment"),
      key("trainer.logger", T::list, Json::array({"console"}), "console | file"),
      at_least(1, "trainer.nnodes", 1, "nodes"),
      at_least(1, "trainer.n_gpus_per_node", 1, "workers per node"),
      at_least(-1, "trainer.save_freq", -1, "save every N steps (-1: never)"),
      at_least(-1, "trainer.test_freq", -1, "validate every N steps (-1: never)"),
      key("trainer.val_before_train", T::boolean, true, "validate before the first step"),
      key("trainer.val_only", T::boolean, false, "validate and stop"),
      at_least(0, "trainer.critic_warmup", 0, "steps updating only the critic"),
      key("trainer.resume_mode", T::string, "auto", "disable | auto | resume_path"),
      key("trainer.resume_from_path", T::string, kNull, "checkpoint folder global_step_N", true),
      key("trainer.default_local_dir", T::string, kNull, "null: checkpoints/{project}/{experiment}", true),
      at_least(1, "trainer.max_actor_ckpt_to_keep", kNull, "null: keep all", true),
      at_least(1, "trainer.max_critic_ckpt_to_keep", kNull, "null: keep all", true),
      key("trainer.device", T::string, "cpu",
          "cpu | cuda | auto (GPUs when every node has one per worker); workers get cuda:<local rank>"),
      key("trainer.seed", T::integer, 1, "controller seed (uids, rollout seeds)"),
      key("trainer.metrics_file", T::string, kNull, "JSONL metrics (null: {default_local_dir}/metrics.jsonl)", true),
      key("trainer.progress_bar", T::boolean, true, "print a progress line per step"),
      key("trainer.call_timeout_s", T::number, 0.0,
          "fail a worker call not answered within this many seconds, naming the late ranks (0: wait forever)", false,
          0),
      key("cluster.nodes", T::string, kNull,
          "caf-node addresses host:port,... (null: workers run in this process); trainer.nnodes of them are used",
          true),
      key("cluster.secret_file", T::string, kNull, "file with the secret the nodes were started with", true),
      at_least(0, "cluster.heartbeat_ms", 500, "middleman heartbeat interval, as the nodes' --heartbeat-ms (0: off)"),
      at_least(0, "cluster.connection_timeout_ms", 3000,
          "drop a node silent this long, as the nodes' --connection-timeout-ms (0: never)"),
      key("cluster.tls_cert", T::string, kNull, "mutual TLS: this controller's certificate (PEM)", true),
      key("cluster.tls_key", T::string, kNull, "mutual TLS: its private key (PEM)", true),
      key("cluster.tls_ca", T::string, kNull, "mutual TLS: the CA that signed the nodes' certificates (PEM)", true),
      key("cluster.data_plane_bind", T::string, kNull,
          "listen address of this controller's data server for large DataProtos (null: HYFLOW_DATA_PLANE_BIND or "
          "127.0.0.1)",
          true),
      key("cluster.data_plane_host", T::string, kNull,
          "address nodes use to reach that server (null: HYFLOW_DATA_PLANE_HOST, else the bind address or host name)",
          true),
  };
  for (auto& o : tail) k.push_back(std::move(o));
  return k;
}

std::vector<ConfigKey> make_sft_keys() {
  std::vector<ConfigKey> k = {
      key("data.train_files", T::string, "", "JSONL with prompt/response columns; empty: data.synthetic"),
      key("data.val_files", T::string, "", "JSONL validation file; empty: data.synthetic"),
      key("data.prompt_key", T::string, "prompt", "prompt column"),
      key("data.response_key", T::string, "response", "response column"),
      at_least(1, "data.max_length", 1024, "prompt + response tokens (right-padded)"),
      key("data.truncation", T::string, "error", "error | left | right"),
      at_least(1, "data.train_batch_size", 256, "rows per optimizer step"),
      at_least(1, "data.micro_batch_size_per_gpu", 4, "rows per micro-batch"),
      key("data.synthetic.task", T::string, "arithmetic", "built-in task when no files are given"),
      at_least(1, "data.synthetic.train_size", 2048, "built-in task: training rows"),
      at_least(1, "data.synthetic.val_size", 128, "built-in task: validation rows"),
      at_least(0, "data.synthetic.max_operand", 99, "built-in task: operands in [0, max_operand]"),
      key("data.synthetic.seed", T::integer, 0, "built-in task: generator seed"),
      key("data.synthetic.correct_fraction", T::number, 1.0, "fraction of rows with the right answer", false, 0),
      key("model.partial_pretrain", T::string, "", "model directory; empty: a new tiny model"),
      at_least(1, "model.tiny.hidden_size", 64, "new tiny model: hidden size"),
      at_least(1, "model.tiny.num_hidden_layers", 2, "new tiny model: layers"),
      at_least(1, "model.tiny.num_attention_heads", 4, "new tiny model: heads"),
      at_least(1, "model.tiny.intermediate_size", 192, "new tiny model: MLP size"),
      key("model.tiny.seed", T::integer, 0, "new tiny model: init seed"),
      key("optim.lr", T::number, 1e-5, "peak learning rate", false, 0),
      key("optim.betas", T::list, Json::array({0.9, 0.95}), "AdamW betas"),
      key("optim.weight_decay", T::number, 0.01, "AdamW weight decay", false, 0),
      key("optim.warmup_steps_ratio", T::number, 0.1, "warmup ratio", false, 0),
      key("optim.lr_scheduler", T::string, "cosine", "cosine | constant"),
      key("optim.clip_grad", T::number, 1.0, "gradient norm clip", false, 0),
      at_least(1, "trainer.total_epochs", 1, "epochs"),
      at_least(1, "trainer.total_training_steps", kNull, "null: epochs x batches", true),
      key("trainer.default_local_dir", T::string, "checkpoints/sft", "output model directory"),
      key("trainer.seed", T::integer, 1, "shuffle seed"),
      at_least(-1, "trainer.test_freq", -1, "validation loss every N steps (-1: at the end)"),
      key("trainer.project_name", T::string, "hyflow", "project (given to the trackers)"),
      key("trainer.experiment_name", T::string, "sft", "experiment (given to the trackers)"),
      key("trainer.logger", T::list, Json::array({"console", "jsonl"}),
          "trackers: console | jsonl (verl: file) | a registered one (docs/tracking.md)"),
      key("trainer.metrics_file", T::string, kNull,
          "the jsonl tracker's file (null: {default_local_dir}/sft_metrics.jsonl)", true),
  };
  return k;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

const char* type_name(KeyType t) {
  switch (t) {
    case T::integer: return "an integer";
    case T::number: return "a number";
    case T::boolean: return "true or false";
    case T::string: return "a string";
    case T::list: return "a list";
  }
  return "?";
}

[[noreturn]] void bad_value(const ConfigKey& k, const std::string& text) {
  throw ValueError("config key '" + k.name + "': expected " + type_name(k.type) + ", got '" + text + "'");
}

/// Numbers must be finite, and integers and numbers at least the key's minimum.
const Json& checked(const ConfigKey& k, const Json& v) {
  if (k.type == T::number && v.is_number() && !std::isfinite(v.get<double>()))
    throw ValueError("config key '" + k.name + "': expected a finite number, got " + v.dump());
  if (!k.minimum.is_null() && v.is_number() && v.get<double>() < k.minimum.get<double>())
    throw ValueError("config key '" + k.name + "' must be >= " + k.minimum.dump() + ", got " + v.dump());
  return v;
}

std::vector<std::string> key_names(const std::vector<ConfigKey>& keys) {
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (const auto& k : keys) names.push_back(k.name);
  return names;
}

/// "unknown config key 'x'<where>; did you mean 'y'? (see --help for the known keys)".
KeyError unknown_key(const std::string& name, const std::vector<ConfigKey>& keys, const std::string& where = "") {
  return KeyError("unknown config key '" + name + "'" + where + did_you_mean(name, key_names(keys)) +
                  " (see --help for the known keys)");
}

}  // namespace

const std::vector<ConfigKey>& config_keys(ConfigSchema schema) {
  static const std::vector<ConfigKey> ppo = make_ppo_keys();
  static const std::vector<ConfigKey> sft = make_sft_keys();
  return schema == ConfigSchema::ppo ? ppo : sft;
}

Json parse_config_value(const ConfigKey& k, const std::string& raw) {
  const std::string text = trim(raw);
  const std::string l = lower(text);
  if (k.nullable && (l == "null" || l == "none" || l == "~")) return Json();
  try {
    switch (k.type) {
      case T::integer: {
        size_t used = 0;
        const long long v = std::stoll(text, &used);
        if (used != text.size()) bad_value(k, raw);
        return checked(k, Json(static_cast<int64_t>(v)));
      }
      case T::number: {
        size_t used = 0;
        const double v = std::stod(text, &used);
        if (used != text.size()) bad_value(k, raw);
        if (!std::isfinite(v))
          throw ValueError("config key '" + k.name + "': expected a finite number, got '" + raw + "'");
        return checked(k, Json(v));
      }
      case T::boolean:
        if (l == "true" || l == "1" || l == "yes" || l == "on") return Json(true);
        if (l == "false" || l == "0" || l == "no" || l == "off") return Json(false);
        bad_value(k, raw);
      case T::string:
        if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') && text.back() == text.front())
          return Json(text.substr(1, text.size() - 2));
        return Json(text);
      case T::list: {
        if (!text.empty() && text.front() == '[') {
          Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
          if (!j.is_array()) bad_value(k, raw);
          return j;
        }
        Json out = Json::array();
        std::stringstream ss(text);
        for (std::string item; std::getline(ss, item, ',');) {
          item = trim(item);
          if (item.empty()) continue;
          Json num = Json::parse(item, nullptr, false);
          out.push_back(num.is_number() ? num : Json(item));
        }
        return out;
      }
    }
  } catch (const std::invalid_argument&) {
    bad_value(k, raw);
  } catch (const std::out_of_range&) {
    bad_value(k, raw);
  }
  bad_value(k, raw);
}

Config::Config(ConfigSchema schema) : schema_(schema) {
  for (const auto& k : config_keys(schema)) values_.emplace_back(k.name, k.default_value);
}

const ConfigKey& Config::key_info(const std::string& name) const {
  for (const auto& k : config_keys(schema_))
    if (k.name == name) return k;
  throw unknown_key(name, config_keys(schema_));
}

void Config::set(const std::string& name, const std::string& text) {
  set_json(name, parse_config_value(key_info(name), text));
}

void Config::set_json(const std::string& name, const Json& value) {
  const ConfigKey& k = key_info(name);
  const bool ok = (value.is_null() && k.nullable) || (k.type == T::integer && value.is_number_integer()) ||
                  (k.type == T::number && value.is_number()) || (k.type == T::boolean && value.is_boolean()) ||
                  (k.type == T::string && value.is_string()) || (k.type == T::list && value.is_array());
  if (!ok) bad_value(k, value.dump());
  if (!value.is_null()) checked(k, value);
  for (auto& [n, v] : values_)
    if (n == name) v = (k.type == T::number && !value.is_null()) ? Json(value.get<double>()) : value;
}

namespace {
po::options_description describe(const std::vector<ConfigKey>& keys) {
  po::options_description desc("hyflow config");
  for (const auto& k : keys) desc.add_options()(k.name.c_str(), po::value<std::string>(), k.help.c_str());
  return desc;
}
}  // namespace

void Config::load_ini(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ValueError("cannot open config file '" + path + "'");
  const auto desc = describe(config_keys(schema_));
  po::parsed_options parsed(&desc);
  try {
    parsed = po::parse_config_file(in, desc, /*allow_unregistered=*/false);
  } catch (const po::unknown_option& e) {
    throw unknown_key(e.get_option_name(), config_keys(schema_), " in " + path);
  } catch (const po::error& e) {
    throw ValueError("config file " + path + ": " + e.what());
  }
  std::set<std::string> given;  // Boost keeps both values of a repeated key: refuse the file instead
  for (const auto& opt : parsed.options)
    if (!given.insert(opt.string_key).second)
      throw ValueError("config key '" + opt.string_key + "' is given twice in " + path);
  for (const auto& opt : parsed.options) {
    if (opt.value.empty()) continue;
    try {
      set(opt.string_key, opt.value.front());
    } catch (const Error& e) {
      throw ValueError(std::string(e.what()) + " (in " + path + ")");
    }
  }
}

bool Config::apply_arguments(const std::vector<std::string>& args) {
  auto desc = describe(config_keys(schema_));
  desc.add_options()("help", "list the keys and their defaults")("config", po::value<std::vector<std::string>>(),
                                                                    "INI file(s) read before the overrides");
  po::parsed_options parsed(&desc);
  try {
    parsed = po::command_line_parser(args)
                 .options(desc)
                 .style(po::command_line_style::unix_style & ~po::command_line_style::allow_guessing)
                 .run();
  } catch (const po::unknown_option& e) {
    std::string name = e.get_option_name();
    while (!name.empty() && name.front() == '-') name.erase(0, 1);
    if (const auto eq = name.find('='); eq != std::string::npos) name.erase(eq);  // Boost keeps "=value"
    throw unknown_key(name, config_keys(schema_));
  } catch (const po::error& e) {
    throw ValueError(std::string("command line: ") + e.what());
  }
  bool help = false;
  for (const auto& opt : parsed.options)
    if (opt.string_key == "help") help = true;
    else if (opt.string_key == "config")
      for (const auto& file : opt.value) load_ini(file);
  for (const auto& opt : parsed.options) {
    if (opt.string_key == "help" || opt.string_key == "config") continue;
    if (opt.value.empty()) throw ValueError("config key '" + opt.string_key + "' needs a value (--key=value)");
    set(opt.string_key, opt.value.front());
  }
  return help;
}

const Json& Config::get(const std::string& name) const {
  for (const auto& [n, v] : values_)
    if (n == name) return v;
  throw KeyError("unknown config key '" + name + "'");
}

int64_t Config::get_int(const std::string& name) const {
  const Json& v = get(name);
  if (!v.is_number_integer()) throw ValueError("config key '" + name + "' is " + v.dump() + ", not an integer");
  return v.get<int64_t>();
}
double Config::get_double(const std::string& name) const {
  const Json& v = get(name);
  if (!v.is_number()) throw ValueError("config key '" + name + "' is " + v.dump() + ", not a number");
  return v.get<double>();
}
bool Config::get_bool(const std::string& name) const {
  const Json& v = get(name);
  if (!v.is_boolean()) throw ValueError("config key '" + name + "' is " + v.dump() + ", not a boolean");
  return v.get<bool>();
}
std::string Config::get_string(const std::string& name) const {
  const Json& v = get(name);
  if (!v.is_string()) throw ValueError("config key '" + name + "' is " + v.dump() + ", not a string");
  return v.get<std::string>();
}

namespace {
Json::json_pointer pointer_of(const std::string& dotted) {
  std::string p = "/";
  p.reserve(dotted.size() + 1);
  for (char ch : dotted) p.push_back(ch == '.' ? '/' : ch);
  return Json::json_pointer(p);
}
}  // namespace

Json Config::tree(bool drop_nulls) const {
  Json out = Json::object();
  for (const auto& [name, v] : values_) {
    if (drop_nulls && v.is_null()) continue;
    out[pointer_of(name)] = v;
  }
  return out;
}

Json Config::subtree(const std::string& prefix, bool drop_nulls) const {
  Json t = tree(drop_nulls);
  const Json::json_pointer ptr = pointer_of(prefix);
  if (!t.contains(ptr)) throw KeyError("no config keys under '" + prefix + "'");
  return t.at(ptr);
}

std::string Config::help_text() const {
  std::ostringstream os;
  for (const auto& k : config_keys(schema_)) {
    const Json& v = get(k.name);
    os << "  --" << k.name << "=" << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n      " << k.help << "\n";
  }
  return os.str();
}

}  // namespace hyflow::trainer
