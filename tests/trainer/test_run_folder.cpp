// The run folder's record: where each config value came from, config.yaml (every key and its
// source, valid YAML), run.json's launches across a fresh run, a resume and a fresh run again.
#include <hyflow/core/error.hpp>
#include <hyflow/core/version.hpp>
#include <hyflow/trainer/config.hpp>
#include <hyflow/trainer/run_folder.hpp>

#include <yaml-cpp/yaml.h>
#include <catch2/catch.hpp>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace hyflow;
using namespace hyflow::trainer;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Folder {
  explicit Folder(const std::string& name)
      : path(fs::temp_directory_path() / ("hyflow_run_folder_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~Folder() { fs::remove_all(path); }
  fs::path path;
};

/// An SFT config with a key from each source: the program, an INI file and the command line.
Config sft_config(const fs::path& dir, const std::string& epochs = "2") {
  fs::create_directories(dir);
  const fs::path ini = dir / "sft.ini";
  std::ofstream(ini) << "[trainer]\nseed = 7\ntotal_epochs = 3\n";
  Config c(ConfigSchema::sft);
  c.set("data.max_length", "64");
  c.apply_arguments({"--config=" + ini.string(), "--trainer.total_epochs=" + epochs, "--trainer.test_freq=-1"});
  return c;
}

nlohmann::json launches(const fs::path& file) {
  return nlohmann::json::parse(read_text(file)).at("launches");
}

}  // namespace

TEST_CASE("Config records where each value came from: default, program, file, command line; the last wins") {
  Folder dir("sources");
  const Config c = sft_config(dir.path);
  CHECK(c.source("data.max_length").kind == KeySource::Kind::program);
  CHECK(c.source("trainer.seed").describe() == "file " + (dir.path / "sft.ini").string());
  CHECK(c.source("trainer.total_epochs").describe() == "command line");  // the file's 3, then the command line's 2
  CHECK(c.get_int("trainer.total_epochs") == 2);
  CHECK(c.source("trainer.test_freq").describe() == "command line");  // given, though equal to the default
  CHECK(c.source("trainer.project_name").describe() == "default");
  CHECK_THROWS_AS(c.source("trainer.nope"), KeyError);
  nlohmann::json given = nlohmann::json::parse(R"({
    "data.max_length": {"value": 64, "source": "program"},
    "trainer.seed": {"value": 7, "source": "file"},
    "trainer.total_epochs": {"value": 2, "source": "command line"},
    "trainer.test_freq": {"value": -1, "source": "command line"}})");
  given["trainer.seed"]["file"] = (dir.path / "sft.ini").string();
  CHECK(config_given(c) == given);
}

TEST_CASE("trainer.console_every: null by default, at least 1, in the PPO and SFT key tables") {
  for (const auto schema : {ConfigSchema::ppo, ConfigSchema::sft}) {
    Config c(schema);
    CHECK(c.is_null("trainer.console_every"));
    c.apply_arguments({"--trainer.console_every=5"});
    CHECK(c.get_int("trainer.console_every") == 5);
    CHECK_THROWS_WITH(c.apply_arguments({"--trainer.console_every=0"}),
                      Contains("'trainer.console_every' must be >= 1, got 0"));
  }
}

TEST_CASE("config.yaml: every key once, marked with its source, and valid YAML with the config's values") {
  Folder dir("yaml");
  const Config c = sft_config(dir.path);
  const std::string yaml = config_yaml(c);
  std::istringstream lines(yaml);
  size_t keyed = 0, defaults = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("  # ") == std::string::npos || line.rfind("#", 0) == 0) continue;
    ++keyed;
    defaults += line.size() >= 9 && line.compare(line.size() - 9, 9, "# default") == 0;
  }
  CHECK(keyed == c.keys().size());
  CHECK(defaults == c.keys().size() - 4);
  CHECK_THAT(yaml, Contains("\ntrainer:\n") && Contains("\n  seed: 7") && Contains("# file " + dir.path.string()));
  const YAML::Node node = YAML::Load(yaml);
  CHECK(node["trainer"]["total_epochs"].as<int>() == 2);
  CHECK(node["trainer"]["default_local_dir"].as<std::string>() == c.get_string("trainer.default_local_dir"));
  CHECK(node["trainer"]["logger"].size() == 2);
  CHECK(node["trainer"]["total_training_steps"].IsNull());
  CHECK(node["optim"]["lr"].as<double>() == c.get_double("optim.lr"));
}

TEST_CASE("run.json: a launch's record; a resume appends; a fresh run moves the earlier record to .old") {
  Folder dir("launches");
  const fs::path run_dir = dir.path / "run";
  write_run_folder(run_dir, sft_config(dir.path), 0);
  REQUIRE(launches(run_dir / "run.json").size() == 1);
  const nlohmann::json first = launches(run_dir / "run.json")[0];
  CHECK(first["resumed_step"] == 0);
  CHECK(first["hyflow_version"] == version());
  CHECK(first["git_commit"] == git_commit());
  CHECK_FALSE(first["git_commit"].get<std::string>().empty());
  CHECK_THAT(first["argv"][0].get<std::string>(), Contains("test_trainer_data"));
  CHECK(first["hardware_threads"].get<int64_t>() >= 1);
  CHECK(first["torch_intra_op_threads"].get<int64_t>() >= 1);
  CHECK(first["start_time"].get<std::string>().size() == std::string("2026-11-29T00:40:00Z").size());
  CHECK(first["config_given"]["trainer.total_epochs"]["value"] == 2);
  CHECK(read_text(run_dir / "config.yaml") == config_yaml(sft_config(dir.path)));

  SECTION("a resume with the same config appends its launch and leaves config.yaml") {
    write_run_folder(run_dir, sft_config(dir.path), 4);
    REQUIRE(launches(run_dir / "run.json").size() == 2);
    CHECK(launches(run_dir / "run.json")[0] == first);
    CHECK_THAT(read_text(run_dir / "run.json"),  // a person reads it: a given key per line
               Contains("\n        \"trainer.test_freq\": {\"source\":\"command line\",\"value\":-1},\n"));
    CHECK(launches(run_dir / "run.json")[1]["resumed_step"] == 4);
    CHECK_FALSE(fs::exists(run_dir / "config.yaml.old"));
  }
  SECTION("a resume with other keys keeps the earlier config.yaml as .old") {
    write_run_folder(run_dir, sft_config(dir.path, "5"), 4);
    CHECK(launches(run_dir / "run.json").size() == 2);
    CHECK(read_text(run_dir / "config.yaml.old") == config_yaml(sft_config(dir.path)));
    CHECK_THAT(read_text(run_dir / "config.yaml"), Contains("total_epochs: 5"));
  }
  SECTION("a fresh run starts a new record; the earlier one is kept as .old, .old.1, ...") {
    write_run_folder(run_dir, sft_config(dir.path), 0);
    write_run_folder(run_dir, sft_config(dir.path), 0);
    CHECK(launches(run_dir / "run.json").size() == 1);
    CHECK(launches(run_dir / "run.json.old")[0] == first);
    CHECK(launches(run_dir / "run.json.old.1").size() == 1);
    CHECK(fs::exists(run_dir / "config.yaml.old.1"));
  }
  SECTION("a resume keeps fields another tool added to run.json") {
    auto run = nlohmann::json::parse(read_text(run_dir / "run.json"));
    run["note"] = "rerun after the disk filled";
    std::ofstream(run_dir / "run.json", std::ios::trunc) << run.dump();
    write_run_folder(run_dir, sft_config(dir.path), 4);
    CHECK(nlohmann::json::parse(read_text(run_dir / "run.json"))["note"] == "rerun after the disk filled");
    CHECK(launches(run_dir / "run.json").size() == 2);
  }
  SECTION("a resume refuses a run.json that is not a run record, and leaves it as it was") {
    std::ofstream(run_dir / "run.json", std::ios::trunc) << "[1, 2]";
    CHECK_THROWS_WITH(write_run_folder(run_dir, sft_config(dir.path), 4),
                      Contains((run_dir / "run.json").string() + ": not a run record"));
    CHECK(read_text(run_dir / "run.json") == "[1, 2]");
  }
}
