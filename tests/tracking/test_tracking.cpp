// Trackers: a toy tracker added with one register_tracker line and used through Tracking next to
// the console; the checks of trainer.logger (unknown names, a tracker listed twice); the console
// line; the JSONL file of a fresh and of a resumed run.
#include <hyflow/core/error.hpp>
#include <hyflow/tracking/all.hpp>

#include <catch2/catch.hpp>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace hyflow;
using namespace hyflow::tracking;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

/// What the toy tracker saw, over every instance.
struct Calls {
  int created = 0, config = 0, log = 0, flush = 0, close = 0;
  std::vector<int64_t> steps;
  std::string experiment;
  bool fail_close = false;
};
Calls calls;

/// The toy tracker of docs/tracking.md: counts the calls it gets.
class CountingTracker : public Tracker {
 public:
  explicit CountingTracker(const RunInfo& run) {
    ++calls.created;
    calls.experiment = run.experiment_name;
  }
  void log_config(const nlohmann::json&) override { ++calls.config; }
  void log(const nlohmann::json&, int64_t step) override {
    ++calls.log;
    calls.steps.push_back(step);
  }
  void flush() override { ++calls.flush; }
  void close() override {
    ++calls.close;
    if (calls.fail_close) throw FormatError("counting tracker: close failed");
  }
};

const bool counting_registered =
    (register_tracker("counting", [](const RunInfo& run) { return std::make_unique<CountingTracker>(run); }), true);

struct TempDir {
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("hyflow_tracking_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

/// The message of the E that `f` throws ("nothing thrown" when it returns).
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "nothing thrown";
}

RunInfo run_info(const fs::path& metrics_file = {}, int64_t resumed_step = 0) {
  return RunInfo{.project_name = "hyflow",
                 .experiment_name = "toy",
                 .local_dir = metrics_file.parent_path().string(),
                 .metrics_file = metrics_file.string(),
                 .total_steps = 4,
                 .resumed_step = resumed_step};
}

/// Creates the trackers of `backends` for a run and closes them.
void track(const std::vector<std::string>& backends) {
  Tracking(backends, run_info()).close();
}

}  // namespace

TEST_CASE("a tracker registered with one line is used through Tracking next to the console") {
  REQUIRE(counting_registered);
  calls = Calls{};
  CHECK(has_tracker("counting"));
  CHECK(tracker_names() ==
        std::vector<std::string>{"console", "counting", "file", "jsonl", "prometheus", "tensorboard"});
  {
    Tracking tracking({"console", "counting"}, run_info());
    CHECK(tracking.backends() == std::vector<std::string>{"console", "counting"});
    CHECK(calls.created == 1);
    CHECK(calls.experiment == "toy");
    tracking.log_config({{"trainer", {{"total_epochs", 1}}}});
    tracking.log({{"critic/score/mean", 0.5}}, 1);
    tracking.log({{"critic/score/mean", 0.75}}, 2);
    tracking.flush();
    tracking.close();
    tracking.close();
    tracking.flush();
    CHECK_THAT(error_of<ValueError>([&] { tracking.log({{"x", 1}}, 3); }), Contains("step 3 logged after close()"));
  }
  CHECK(calls.config == 1);
  CHECK(calls.log == 2);
  CHECK(calls.steps == std::vector<int64_t>{1, 2});
  CHECK(calls.flush == 1);
  CHECK(calls.close == 1);  // close() twice and the destructor: closed once

  SECTION("the destructor closes a Tracking that was not closed") {
    calls = Calls{};
    { Tracking tracking({"counting"}, run_info()); }
    CHECK(calls.close == 1);
  }
  SECTION("close() rethrows a tracker's failure and closes once; the destructor never throws") {
    calls = Calls{};
    calls.fail_close = true;
    Tracking tracking({"counting", "console"}, run_info());
    CHECK_THAT(error_of<FormatError>([&] { tracking.close(); }), Contains("counting tracker: close failed"));
    CHECK(calls.close == 1);
    { Tracking failing({"counting"}, run_info()); }
    CHECK(calls.close == 2);
  }
  SECTION("metrics that are not a JSON object are refused") {
    Tracking tracking({"counting"}, run_info());
    const auto not_an_object = nlohmann::json::array({1, 2});
    CHECK_THAT(error_of<ValueError>([&] { tracking.log(not_an_object, 1); }),
               Contains("metrics of step 1 are not a JSON object"));
  }
}

TEST_CASE("an unknown tracker anywhere in trainer.logger is a KeyError naming it, before any tracker is created") {
  calls = Calls{};
  const std::string unknown = error_of<KeyError>([] { track({"counting", "console", "jsnl"}); });
  CHECK(unknown ==
        "unknown tracker 'jsnl' in trainer.logger; did you mean 'jsonl'? "
        "(known: console, counting, file, jsonl, prometheus, tensorboard)");
  CHECK(calls.created == 0);
  CHECK_THAT(error_of<KeyError>([] { make_tracker("wandb", run_info()); }),
             Contains("unknown tracker 'wandb' in trainer.logger") && Contains("(known: console"));
}

TEST_CASE("a tracker listed twice in trainer.logger is refused, under its alias too") {
  CHECK(error_of<ValueError>([] {
          track({"console", "console"});
        }) == "tracker 'console' is listed twice in trainer.logger");
  CHECK(error_of<ValueError>([] {
          track({"jsonl", "console", "file"});
        }) == "tracker 'file' is listed twice in trainer.logger (as 'jsonl' and 'file')");
}

TEST_CASE("register_tracker refuses a taken name and an empty factory") {
  const TrackerFactory make = [](const RunInfo& run) { return std::make_unique<CountingTracker>(run); };
  CHECK_THAT(error_of<ValueError>([&] { register_tracker("jsonl", make); }),
             Contains("tracker 'jsonl' is already registered"));
  CHECK_THAT(error_of<ValueError>([&] { register_tracker("empty", TrackerFactory{}); }), Contains("'empty'"));
  CHECK_FALSE(has_tracker("empty"));
}

TEST_CASE("logger_backends reads trainer.logger's list of names") {
  CHECK(logger_backends(nlohmann::json::array({"console", "jsonl"})) == std::vector<std::string>{"console", "jsonl"});
  CHECK(logger_backends(nlohmann::json::array()).empty());
  CHECK_THAT(error_of<ValueError>([&] {
               logger_backends(nlohmann::json::array({"console", 1}));
             }),
             Contains("trainer.logger") && Contains("[\"console\",1]"));
  CHECK_THAT(error_of<ValueError>([&] { logger_backends("console"); }), Contains("trainer.logger"));
}

TEST_CASE("format_progress: the bar, the headline figures, speed and ETA, the last validation") {
  CHECK(format_progress({{"critic/score/mean", 0.41}, {"actor/pg_loss", 0.0125}, {"timing_s/step", 2.1}}, 3, 40) ==
        "step 3/40 [=                   ] score 0.410 pg_loss 0.013 | 2.10 s/step");
  CHECK(format_progress({{"val-core/arithmetic/acc/mean@1", 0.5}}, 0, 0) ==
        "step 0/0 [                    ] val-core/arithmetic/acc/mean@1 0.500");
  CHECK(format_progress({{"train/loss", 1.5}, {"train/lr", 1e-3}, {"val/loss", 1.25}}, 4, 4) ==
        "step 4/4 [====================] loss 1.500 val/loss 1.250");
  ProgressExtras extras{.eta_s = 3723.4,
                        .last_validation = {{"val-core/arithmetic/acc/mean@1", 0.625}},
                        .last_validation_step = 100};
  CHECK(format_progress({{"critic/score/mean", 0.5}, {"timing_s/step", 0.125}, {"perf/throughput", 5321.7}}, 150,
                        2000, extras) ==
        "step 150/2000 [=                   ] score 0.500 | 0.12 s/step 5322 tok/s ETA 1:02:03 | "
        "val-core/arithmetic/acc/mean@1 0.625 (step 100)");
  SECTION("a step that validates shows its own result, not the carried one") {
    CHECK(format_progress({{"val-core/arithmetic/acc/mean@1", 0.75}}, 200, 2000, extras) ==
          "step 200/2000 [==                  ] val-core/arithmetic/acc/mean@1 0.750 | ETA 1:02:03");
    CHECK(format_progress({{"val/loss", 0.5}}, 200, 2000, {.last_validation = {{"val/loss", 0.75}}}) ==
          "step 200/2000 [==                  ] val/loss 0.500");
  }
}

TEST_CASE("format_duration: h:mm:ss of whole seconds, '?' for what is not a duration") {
  CHECK(format_duration(0) == "0:00:00");
  CHECK(format_duration(59.4) == "0:00:59");
  CHECK(format_duration(59.5) == "0:01:00");
  CHECK(format_duration(3600 + 2 * 60 + 3) == "1:02:03");
  CHECK(format_duration(100 * 3600) == "100:00:00");
  CHECK(format_duration(-1) == "?");
  CHECK(format_duration(std::nan("")) == "?");
}

namespace {

/// A console tracker on a string stream with a clock the test moves.
struct ConsoleUnderTest {
  explicit ConsoleUnderTest(std::optional<bool> terminal, int64_t total = 4, int64_t console_every = 0,
                            int64_t resumed_step = 0) {
    RunInfo run = run_info();
    run.total_steps = total;
    run.console_every = console_every;
    run.resumed_step = resumed_step;
    console = std::make_unique<ConsoleTracker>(
        run, ConsoleOptions{.out = &out, .terminal = terminal, .clock = [this] { return now; }});
  }
  /// The printed lines, each cut after its step counter ("step 3/40").
  std::vector<std::string> steps() const {
    std::vector<std::string> out_steps;
    std::istringstream lines(out.str());
    for (std::string line; std::getline(lines, line);) out_steps.push_back(line.substr(0, line.find(" [")));
    return out_steps;
  }
  std::ostringstream out;
  double now = 1000.0;
  std::unique_ptr<ConsoleTracker> console;
};

}  // namespace

TEST_CASE("the console tracker prints format_progress's line per step on a terminal") {
  ConsoleUnderTest t(/*terminal=*/true);
  CHECK(t.console->console_every() == 1);
  t.console->log_config({{"trainer", {{"total_epochs", 1}}}});
  t.console->log({{"train/loss", 2.0}}, 2);
  t.console->close();
  CHECK(t.out.str() == "step 2/4 [==========          ] loss 2.000\n");
  CHECK(ConsoleTracker(run_info(), {.out = &t.out}).console_every() == 10);  // not std::cout: no terminal
}

TEST_CASE("the console's ETA is the recent mean s/step times the steps left") {
  ConsoleUnderTest t(/*terminal=*/true, /*total=*/100);
  t.console->log({{"train/loss", 2.0}}, 1);  // one step: no rate yet
  t.now += 2.0;
  t.console->log({{"train/loss", 2.0}}, 2);  // 2 s/step, 98 steps left
  t.now += 4.0;
  t.console->log({{"train/loss", 2.0}}, 3);  // (2 + 4) / 2 = 3 s/step, 97 left
  std::vector<std::string> lines;
  std::istringstream text(t.out.str());
  for (std::string line; std::getline(text, line);) lines.push_back(line);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "step 1/100 [                    ] loss 2.000");
  CHECK_THAT(lines[1], Catch::Matchers::EndsWith("| ETA 0:03:16"));
  CHECK_THAT(lines[2], Catch::Matchers::EndsWith("| ETA 0:04:51"));
  SECTION("only the last 10 intervals count") {
    for (int64_t step = 4; step <= 13; ++step) {
      t.now += 1.0;
      t.console->log({{"train/loss", 2.0}}, step);  // ten steps of 1 s: the 2 s and 4 s ones are out
    }
    CHECK_THAT(t.out.str(), Catch::Matchers::EndsWith("| ETA 0:01:27\n"));  // 87 steps left at 1 s
  }
  SECTION("the last step has no ETA") {
    ConsoleUnderTest last(true, /*total=*/2);
    last.console->log({{"train/loss", 2.0}}, 1);
    last.now += 5;
    last.console->log({{"train/loss", 1.0}}, 2);
    CHECK(last.out.str() == "step 1/2 [==========          ] loss 2.000\nstep 2/2 [====================] loss 1.000\n");
  }
}

TEST_CASE("the console carries the last validation over to the lines of later steps") {
  ConsoleUnderTest t(/*terminal=*/true, /*total=*/10);
  t.console->log({{"val-core/arithmetic/acc/mean@1", 0.25}}, 0);
  t.console->log({{"critic/score/mean", 0.5}}, 1);
  t.console->log({{"critic/score/mean", 0.5}, {"val-core/arithmetic/acc/mean@1", 0.5}}, 2);
  t.console->log({{"critic/score/mean", 0.75}}, 3);
  std::istringstream text(t.out.str());
  std::vector<std::string> lines;
  for (std::string line; std::getline(text, line);) lines.push_back(line);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == "step 0/10 [                    ] val-core/arithmetic/acc/mean@1 0.250");
  CHECK_THAT(lines[1], Catch::Matchers::EndsWith("| val-core/arithmetic/acc/mean@1 0.250 (step 0)"));
  CHECK_THAT(lines[2], !Contains("(step"));
  CHECK_THAT(lines[3], Catch::Matchers::EndsWith("| val-core/arithmetic/acc/mean@1 0.500 (step 2)"));
}

TEST_CASE("the console is quiet when not on a terminal: every 10th step, the first, validations and the last") {
  SECTION("not a terminal: every 10th step by default") {
    ConsoleUnderTest t(/*terminal=*/false, /*total=*/35);
    CHECK(t.console->console_every() == 10);
    t.console->log({{"val-core/a", 0.1}}, 0);
    for (int64_t step = 1; step <= 35; ++step)
      t.console->log(step == 25 ? nlohmann::json{{"val-core/a", 0.2}} : nlohmann::json{{"train/loss", 1.0}}, step);
    CHECK(t.steps() == std::vector<std::string>{"step 0/35", "step 1/35", "step 10/35", "step 20/35", "step 25/35",
                                                "step 30/35", "step 35/35"});
  }
  SECTION("trainer.console_every wins over the terminal check; a resumed run prints its first step") {
    ConsoleUnderTest t(/*terminal=*/true, /*total=*/12, /*console_every=*/4, /*resumed_step=*/5);
    CHECK(t.console->console_every() == 4);
    for (int64_t step = 6; step <= 12; ++step) t.console->log({{"train/loss", 1.0}}, step);
    CHECK(t.steps() == std::vector<std::string>{"step 6/12", "step 8/12", "step 12/12"});
  }
  SECTION("a terminal prints every step") {
    ConsoleUnderTest t(/*terminal=*/true, /*total=*/3);
    for (int64_t step = 1; step <= 3; ++step) t.console->log({{"train/loss", 1.0}}, step);
    CHECK(t.steps() == std::vector<std::string>{"step 1/3", "step 2/3", "step 3/3"});
  }
}

TEST_CASE("jsonl: one line per step with its step, in a file whose folders are created") {
  TempDir dir("lines");
  const fs::path file = dir.path / "run" / "metrics.jsonl";
  {
    Tracking tracking({"file"}, run_info(file));
    tracking.log({{"b", 2}, {"a", 1.5}}, 1);
    tracking.log({{"a", 0.5}, {"step", 99}}, 2);
    CHECK(read_text(file) == "{\"a\":1.5,\"b\":2,\"step\":1}\n{\"a\":0.5,\"step\":2}\n");  // flushed per step
  }
  CHECK(read_text(file) == "{\"a\":1.5,\"b\":2,\"step\":1}\n{\"a\":0.5,\"step\":2}\n");
  CHECK_THAT(error_of<ValueError>([&] { JsonlTracker{run_info()}; }), Contains("trainer.metrics_file"));
}

TEST_CASE("jsonl of a fresh run: an earlier run's file moves to .old, .old.1, ..., never overwritten") {
  TempDir dir("fresh");
  const fs::path file = dir.path / "metrics.jsonl";
  write_text(file, "{\"step\":1}\n{\"step\":2}\n");
  {
    Tracking tracking({"jsonl"}, run_info(file));
    tracking.log({{"a", 1}}, 1);
  }
  CHECK(read_text(file.string() + ".old") == "{\"step\":1}\n{\"step\":2}\n");
  CHECK(read_text(file) == "{\"a\":1,\"step\":1}\n");
  { Tracking tracking({"jsonl"}, run_info(file)); }
  CHECK(read_text(file.string() + ".old") == "{\"step\":1}\n{\"step\":2}\n");
  CHECK(read_text(file.string() + ".old.1") == "{\"a\":1,\"step\":1}\n");
  CHECK_FALSE(fs::exists(file));  // nothing logged yet
}

TEST_CASE("jsonl of a run resumed at step S: the earlier run's lines after S move to .after_step_S") {
  TempDir dir("resumed");
  const fs::path file = dir.path / "metrics.jsonl";
  const std::string before = "{\"a\": 1, \"step\": 1}\n{\"step\":2,\"a\":2}\n";
  const std::string after = "{\"step\": 3, \"a\": 3}\n{\"a\":4,\"step\":4}\n";
  write_text(file, before + after);
  {
    Tracking tracking({"jsonl"}, run_info(file, 2));
    tracking.log({{"a", 30}}, 3);
  }
  CHECK(read_text(file) == before + "{\"a\":30,\"step\":3}\n");
  CHECK(read_text(file.string() + ".after_step_2") == after);

  SECTION("a second resume at the same step numbers its side file") {
    { JsonlTracker again(run_info(file, 2)); }
    CHECK(read_text(file) == before);
    CHECK(read_text(file.string() + ".after_step_2") == after);
    CHECK(read_text(file.string() + ".after_step_2.1") == "{\"a\":30,\"step\":3}\n");
  }
  SECTION("nothing after the step: the file stays as it is, no side file") {
    { JsonlTracker again(run_info(file, 3)); }
    CHECK(read_text(file) == before + "{\"a\":30,\"step\":3}\n");
    CHECK_FALSE(fs::exists(file.string() + ".after_step_3"));
  }
  SECTION("a malformed line is a FormatError naming file:line, and the file is left alone") {
    write_text(file, before + "{\"a\": 5}\n");
    CHECK_THAT(error_of<FormatError>([&] { JsonlTracker{run_info(file, 1)}; }),
               Catch::Matchers::Equals(file.string() + ":3: not a metrics line with an integer step"));
    write_text(file, "{\"step\":1}\n\nnot json\n");
    CHECK_THAT(error_of<FormatError>([&] { JsonlTracker{run_info(file, 1)}; }), Contains("metrics.jsonl:3:"));
    CHECK(read_text(file) == "{\"step\":1}\n\nnot json\n");
  }
}

TEST_CASE("jsonl: log_config writes no file (the run folder keeps the config)") {
  TempDir dir("config");
  const fs::path file = dir.path / "metrics.jsonl";
  JsonlTracker tracker(run_info(file));
  tracker.log_config({{"trainer", {{"total_epochs", 1}}}});
  tracker.close();
  CHECK(fs::is_empty(dir.path));
}
