// The run folder's record of a launch: config.yaml (every key and its source) and run.json.
#include <hyflow/core/error.hpp>
#include <hyflow/core/files.hpp>
#include <hyflow/core/version.hpp>
#include <hyflow/trainer/run_folder.hpp>

#include <ATen/Parallel.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace hyflow::trainer {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRunFile = "run.json";
constexpr const char* kConfigFile = "config.yaml";
/// When this program started (static initialization, before main): the launch's start time.
const std::chrono::system_clock::time_point kProcessStart = std::chrono::system_clock::now();
/// config.yaml's source comments start at this column when the "key: value" part is shorter.
constexpr size_t kCommentColumn = 48;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void move_aside(const fs::path& path) {
  if (!fs::exists(path)) return;
  const fs::path old = free_path(path, ".old");
  fs::rename(path, old);
  std::cout << "the record of an earlier run moved to " << old.string() << "\n";
}

void emit_yaml(std::ostringstream& os, const Config& config, const nlohmann::json& node, const std::string& prefix,
               int indent) {
  for (const auto& [key, value] : node.items()) {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    const std::string pad(static_cast<size_t>(indent), ' ');
    if (value.is_object()) {
      os << pad << key << ":\n";
      emit_yaml(os, config, value, name, indent + 2);
      continue;
    }
    const std::string line = pad + key + ": " + value.dump();
    os << line << std::string(line.size() < kCommentColumn ? kCommentColumn - line.size() : 0, ' ') << "  # "
       << config.source(name).describe() << "\n";
  }
}

/// argv of this process as the kernel keeps it (the program and its arguments as given).
std::vector<std::string> process_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(in, arg, '\0');) args.push_back(arg);
  return args;
}

std::string utc(std::chrono::system_clock::time_point time) {
  const std::time_t t = std::chrono::system_clock::to_time_t(time);
  std::tm parts{};
  gmtime_r(&t, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

/// run.json as a person reads it: a launch's fields one per line (argv on one), the keys of
/// config_given one per line. Still plain JSON.
std::string run_json_text(const nlohmann::json& run) {
  std::ostringstream os;
  os << "{\n  \"launches\": [";
  const auto& launches = run.at("launches");
  for (size_t i = 0; i < launches.size(); ++i) {
    os << (i ? ",\n" : "\n") << "    {";
    const auto& launch = launches[i];
    bool first = true;
    for (const auto& [field, value] : launch.items()) {
      os << (first ? "\n" : ",\n") << "      " << nlohmann::json(field).dump() << ": ";
      first = false;
      if (!value.is_object() || value.empty()) {
        os << value.dump();
        continue;
      }
      os << "{";
      bool first_key = true;
      for (const auto& [key, entry] : value.items()) {
        os << (first_key ? "\n" : ",\n") << "        " << nlohmann::json(key).dump() << ": " << entry.dump();
        first_key = false;
      }
      os << "\n      }";
    }
    os << "\n    }";
  }
  os << (launches.empty() ? "]" : "\n  ]");
  for (const auto& [key, value] : run.items())  // fields another tool added: kept
    if (key != "launches") os << ",\n  " << nlohmann::json(key).dump() << ": " << value.dump();
  os << "\n}\n";
  return os.str();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

}  // namespace

std::string config_yaml(const Config& config) {
  std::ostringstream os;
  os << "# The resolved config of this run: every key, written when the run was launched (run.json lists\n"
        "# the launches). Each line ends with where its value came from: \"default\" (the key's default),\n"
        "# \"program\" (set by the program, e.g. hyflow-grpo's algorithm.adv_estimator), \"file <ini>\" or\n"
        "# \"command line\". `grep -v '# default$'` shows what was chosen. Values in JSON syntax (YAML reads\n"
        "# them); docs/observing.md.\n";
  emit_yaml(os, config, config.tree(), "", 0);
  return os.str();
}

nlohmann::json config_given(const Config& config) {
  nlohmann::json given = nlohmann::json::object();
  for (const auto& name : config.keys()) {
    const KeySource& source = config.source(name);
    if (source.kind == KeySource::Kind::key_default) continue;
    const bool file = source.kind == KeySource::Kind::file;
    nlohmann::json entry = {{"value", config.get(name)}, {"source", file ? std::string("file") : source.describe()}};
    if (file) entry["file"] = source.file;
    given[name] = std::move(entry);
  }
  return given;
}

nlohmann::json launch_record(const Config& config, int64_t resumed_step) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  return {{"start_time", utc(kProcessStart)},
          {"argv", process_arguments()},
          {"working_directory", ec ? std::string() : cwd.string()},
          {"hyflow_version", version()},
          {"git_commit", git_commit()},
          {"host", host_name()},
          {"hardware_threads", std::thread::hardware_concurrency()},
          {"omp_num_threads", omp ? nlohmann::json(omp) : nlohmann::json()},
          {"torch_intra_op_threads", at::get_num_threads()},
          {"torch_inter_op_threads", at::get_num_interop_threads()},
          {"pid", static_cast<int64_t>(::getpid())},
          {"resumed_step", resumed_step},
          {"config_given", config_given(config)}};
}

void write_run_folder(const fs::path& dir, const Config& config, int64_t resumed_step) {
  fs::create_directories(dir);
  const fs::path run_file = dir / kRunFile, config_file = dir / kConfigFile;
  nlohmann::json run = {{"launches", nlohmann::json::array()}};
  if (resumed_step == 0) {
    move_aside(run_file);
    move_aside(config_file);
  } else if (fs::exists(run_file)) {
    run = nlohmann::json::parse(read_text(run_file), nullptr, /*allow_exceptions=*/false);
    if (!run.is_object() || !run.contains("launches") || !run.at("launches").is_array())
      throw FormatError(run_file.string() + ": not a run record ({\"launches\": [...]}); move it away to resume");
  }
  const std::string yaml = config_yaml(config);
  if (fs::exists(config_file) && read_text(config_file) != yaml)  // a resume with changed keys: keep the old one
    fs::rename(config_file, free_path(config_file, ".old"));
  write_text_atomically(config_file, yaml);
  run["launches"].push_back(launch_record(config, resumed_step));
  write_text_atomically(run_file, run_json_text(run));
}

}  // namespace hyflow::trainer
