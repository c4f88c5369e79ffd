// Key tables, INI/CLI parsing (Boost.ProgramOptions) and typed values of the trainer config.
// The PPO table is the trainer's own sections plus the role workers' declarations
// (workers::worker_config_keys), so a key is declared once, where it is read.
#include <hyflow/core/error.hpp>
#include <hyflow/core/text.hpp>
#include <hyflow/core/suggest.hpp>
#include <hyflow/trainer/config.hpp>
#include <hyflow/trainer/ppo_config.hpp>
#include <hyflow/trainer/sft_trainer.hpp>
#include <hyflow/workers/config.hpp>

#include <boost/program_options.hpp>
#include <yaml-cpp/yaml.h>

#include <cmath>
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

/// The trainer's sections (ppo_config.cpp) and the workers' (workers::worker_config_keys), each
/// key declared once where it is read.
std::vector<ConfigKey> make_ppo_keys() {
  std::vector<ConfigKey> k = ppo_trainer_config_keys();
  for (auto& o : workers::worker_config_keys()) k.push_back(std::move(o));
  std::set<std::string> names;
  for (const auto& o : k)
    if (!names.insert(o.name).second) throw Error("config key '" + o.name + "' is declared twice");
  return k;
}

std::vector<ConfigKey> make_sft_keys() {
  std::vector<ConfigKey> k = {
      key("data.train_files", T::string, "", "JSONL or Parquet with prompt/response columns; empty: data.synthetic"),
      key("data.val_files", T::string, "", "JSONL or Parquet validation file; empty: data.synthetic"),
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
      key("data.synthetic.tool_fraction", T::number, 1.0,
          "multiplication_calculator: fraction of problems through the tool (the others answered at once)", false, 0),
      key("data.apply_chat_template_kwargs.default_system", T::string, kNull,
          "chat tasks: the system turn (null: the template's own; docs/agents.md)", true),
      key("data.apply_chat_template_kwargs.list_tools", T::boolean, true,
          "the tools' schemas in the system turn (the chat tasks list none: set false, as in the GRPO config)"),
      key("model.partial_pretrain", T::string, "", "model directory; empty: a new tiny model"),
      at_least(1, "model.tiny.hidden_size", 64, "new tiny model: hidden size"),
      at_least(1, "model.tiny.num_hidden_layers", 2, "new tiny model: layers"),
      at_least(1, "model.tiny.num_attention_heads", 4, "new tiny model: heads"),
      at_least(1, "model.tiny.intermediate_size", 192, "new tiny model: MLP size"),
      key("model.tiny.rope_theta", T::number, 10000.0, "new tiny model: rotary base (rope_theta)", false, 1),
      key("model.tiny.seed", T::integer, 0, "new tiny model: init seed"),
      key("optim.clip_grad", T::number, 1.0, "gradient norm clip", false, 0),
      at_least(1, "trainer.total_epochs", 1, "epochs"),
      at_least(1, "trainer.total_training_steps", kNull, "null: epochs x batches", true),
      key("trainer.default_local_dir", T::string, "checkpoints/sft", "output model directory"),
      key("trainer.seed", T::integer, 1, "shuffle seed"),
      at_least(-1, "trainer.test_freq", -1, "validation loss every N steps (-1: at the end)"),
      key("trainer.project_name", T::string, "hyflow", "project (given to the trackers)"),
      key("trainer.experiment_name", T::string, "sft", "experiment (given to the trackers)"),
      key("trainer.logger", T::list, Json::array({"console", "jsonl"}),
          "trackers: console | jsonl (verl: file) | tensorboard | prometheus | a registered one (docs/tracking.md)"),
      at_least(1, "trainer.console_every", kNull,
               "hyflow: the console tracker prints every Nth step (null: 1 on a terminal, 10 into a pipe or "
               "file); the first, validation and last steps always",
               true),
      key("trainer.metrics_file", T::string, kNull,
          "the jsonl tracker's file (null: {default_local_dir}/sft_metrics.jsonl)", true),
      key("trainer.prometheus.port", T::integer, kNull,
          "the prometheus tracker's GET /metrics port; required with it (0: a free port, printed)", true, 0),
      key("trainer.prometheus.bind", T::string, "127.0.0.1",
          "its listen address (other than loopback: needs token_file)"),
      key("trainer.prometheus.token_file", T::string, kNull,
          "file with the bearer token every scrape must send (docs/metrics.md)", true),
  };
  // optim.*: the actor's optimizer section (workers::parse_optim_config), with SFT's defaults
  for (auto& o : workers::optim_config_keys("optim", sft_optim_defaults())) k.push_back(std::move(o));
  return k;
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

/// One item of a bracketed list: a quoted scalar is a string; a plain one a number, true/false,
/// null or a bare string (Hydra's rules for override values).
Json list_item(const ConfigKey& k, const YAML::Node& item, const std::string& raw) {
  if (!item.IsScalar())
    throw ValueError("config key '" + k.name + "': expected a flat list such as ['console','jsonl'], got '" + raw +
                     "'");
  const std::string& v = item.Scalar();
  if (item.Tag() == "!") return Json(v);  // quoted
  Json number = Json::parse(v, nullptr, /*allow_exceptions=*/false);
  if (number.is_number()) return number;
  const std::string l = ascii_lower(v);
  if (l == "true" || l == "false") return Json(l == "true");
  if (l == "null" || l == "~") return Json();
  return Json(v);
}

/// "[a, 'b', 1.5]" as Hydra (and YAML's flow sequences) read it: single or double quotes, or none.
Json parse_list(const ConfigKey& k, const std::string& raw, const std::string& text) {
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ValueError("config key '" + k.name + "': expected a list such as ['console','jsonl'], got '" + raw +
                     "' (" + e.msg + ")");
  }
  if (!node.IsSequence()) bad_value(k, raw);
  Json out = Json::array();
  for (const auto& item : node) out.push_back(list_item(k, item, raw));
  return out;
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
  const std::string l = ascii_lower(text);
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
        if (!text.empty() && text.front() == '[') return parse_list(k, raw, text);
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

std::string KeySource::describe() const {
  switch (kind) {
    case Kind::key_default: return "default";
    case Kind::program: return "program";
    case Kind::file: return "file " + file;
    case Kind::command_line: return "command line";
  }
  return "?";
}

Config::Config(ConfigSchema schema) : schema_(schema) {
  for (const auto& k : config_keys(schema)) values_.push_back({k.name, k.default_value, {}});
}

const ConfigKey& Config::key_info(const std::string& name) const {
  for (const auto& k : config_keys(schema_))
    if (k.name == name) return k;
  throw unknown_key(name, config_keys(schema_));
}

void Config::set(const std::string& name, const std::string& text) {
  assign(name, parse_config_value(key_info(name), text), {.kind = KeySource::Kind::program});
}

void Config::set_json(const std::string& name, const Json& value) {
  assign(name, value, {.kind = KeySource::Kind::program});
}

void Config::assign(const std::string& name, const Json& value, KeySource source) {
  const ConfigKey& k = key_info(name);
  const bool ok = (value.is_null() && k.nullable) || (k.type == T::integer && value.is_number_integer()) ||
                  (k.type == T::number && value.is_number()) || (k.type == T::boolean && value.is_boolean()) ||
                  (k.type == T::string && value.is_string()) || (k.type == T::list && value.is_array());
  if (!ok) bad_value(k, value.dump());
  if (!value.is_null()) checked(k, value);
  for (auto& v : values_)
    if (v.name == name) {
      v.value = (k.type == T::number && !value.is_null()) ? Json(value.get<double>()) : value;
      v.source = std::move(source);
    }
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
      assign(opt.string_key, parse_config_value(key_info(opt.string_key), opt.value.front()),
             {.kind = KeySource::Kind::file, .file = path});
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
    assign(opt.string_key, parse_config_value(key_info(opt.string_key), opt.value.front()),
           {.kind = KeySource::Kind::command_line});
  }
  return help;
}

const Json& Config::get(const std::string& name) const {
  for (const auto& v : values_)
    if (v.name == name) return v.value;
  throw KeyError("unknown config key '" + name + "'");
}

const KeySource& Config::source(const std::string& name) const {
  for (const auto& v : values_)
    if (v.name == name) return v.source;
  throw KeyError("unknown config key '" + name + "'");
}

std::vector<std::string> Config::keys() const {
  std::vector<std::string> names;
  names.reserve(values_.size());
  for (const auto& v : values_) names.push_back(v.name);
  return names;
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
  for (const auto& v : values_) {
    if (drop_nulls && v.value.is_null()) continue;
    out[pointer_of(v.name)] = v.value;
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
