#pragma once
// The run folder (trainer.default_local_dir) records who launched a run and with what, beside the
// metrics and checkpoints, so that a person can read it later (docs/observing.md):
// - config.yaml: the resolved config, every key, each marked with where its value came from
//   ("# default", "# file config/x.ini", "# command line", "# program");
// - run.json: {"launches": [...]}, one entry per launch of the run: start time, command line,
//   working directory, hyflow version and git commit, host, hardware and torch threads,
//   OMP_NUM_THREADS, the resumed step and the keys the launch set (value and source).
// A fresh launch (resumed step 0) moves an earlier run's files to `.old` (`.old.1`, ...); a resumed
// launch appends to run.json and keeps an earlier, different config.yaml as `.old` first, so no
// launch's record is lost.

#include <hyflow/trainer/config.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace hyflow::trainer {

/// `config.yaml`: the keys nested as YAML (values in JSON syntax, which YAML reads), each line ending
/// in "# <source>" (KeySource::describe()), under a header that explains the marks.
std::string config_yaml(const Config& config);

/// The keys whose source is not the default: {key: {"value": v, "source": "file", "file": path}}.
nlohmann::json config_given(const Config& config);

/// This launch: start time (the program's, UTC, ISO 8601), argv (/proc/self/cmdline), working directory,
/// hyflow_version, git_commit, host, hardware_threads, omp_num_threads (the environment's, null
/// when unset), torch_intra_op_threads, torch_inter_op_threads, pid, resumed_step, config_given.
nlohmann::json launch_record(const Config& config, int64_t resumed_step);

/// Writes config.yaml and adds launch_record to run.json in `dir` (created when missing). A fresh
/// launch (resumed_step 0) first moves an earlier run.json and config.yaml aside to `.old`; a
/// resumed one appends. FormatError naming the file when an existing run.json of a resumed run is
/// not {"launches": [...]} (it is left as it was).
void write_run_folder(const std::filesystem::path& dir, const Config& config, int64_t resumed_step);

}  // namespace hyflow::trainer
