// The tensorboard tracker, checked against TensorBoard's schema: a run written through Tracking
// is read back with framing code of this file (its own CRC-32C) and protobuf's own parser
// (Event::ParseFromString of the generated classes); every number must come back as the logged
// double rounded once to float32, bit for bit.
// Then hyflow's reader on damaged files (a cut-off tail, a flipped CRC byte, a huge length),
// the CRC-32C vectors, TENSORBOARD_DIR, and the files of a fresh and of a resumed run.
#include <hyflow/core/error.hpp>
#include <hyflow/tracking/all.hpp>

#include "hyflow/tensorboard/event.pb.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

using namespace hyflow;
using namespace hyflow::tracking;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
namespace pb = hyflow::tensorboard;

namespace {

struct TempDir {
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("hyflow_tensorboard_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::remove_all(path.string() + ".old");
    fs::create_directories(path);
    ::unsetenv("TENSORBOARD_DIR");
  }
  ~TempDir() {
    fs::remove_all(path);
    ::unsetenv("TENSORBOARD_DIR");
  }
  fs::path path;
};

RunInfo run_in(const fs::path& dir, int64_t resumed_step = 0) {
  return RunInfo{.project_name = "p",
                 .experiment_name = "e",
                 .local_dir = dir.string(),
                 .metrics_file = (dir / "metrics.jsonl").string(),
                 .total_steps = 3,
                 .resumed_step = resumed_step};
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

// --- the test's own TFRecord framing, independent of tracking/src/tfrecord.cpp -----------------

/// CRC-32C bit by bit (no table), the definition rather than the writer's method.
uint32_t bitwise_crc32c(const std::string& data) {
  uint32_t crc = ~0u;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

uint32_t masked(const std::string& data) {
  const uint32_t crc = bitwise_crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

uint64_t little_endian(const std::string& bytes, size_t at, int n) {
  uint64_t value = 0;
  for (int i = n - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

std::string le_bytes(uint64_t value, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
  return out;
}

/// Every record of a well-formed file, both CRCs checked; a failed REQUIRE for anything else.
std::vector<std::string> parse_framing(const std::string& bytes) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 16);
    const uint64_t length = little_endian(bytes, at, 8);
    REQUIRE(little_endian(bytes, at + 8, 4) == masked(bytes.substr(at, 8)));
    REQUIRE(bytes.size() - at - 16 >= length);
    std::string data = bytes.substr(at + 12, length);
    REQUIRE(little_endian(bytes, at + 12 + length, 4) == masked(data));
    records.push_back(std::move(data));
    at += 16 + length;
  }
  return records;
}

std::vector<pb::Event> parse_events(const fs::path& file) {
  std::vector<pb::Event> events;
  for (const auto& record : parse_framing(read_bytes(file))) {
    pb::Event event;
    REQUIRE(event.ParseFromString(record));
    events.push_back(std::move(event));
  }
  return events;
}

/// The metrics of the run below: doubles that float32 cannot hold, the edges of the format,
/// integers, a boolean, and values that are not numbers (skipped).
nlohmann::json step_metrics(int64_t step) {
  const double d = static_cast<double>(step);
  return {{"actor/pg_loss", 0.1 * d + 1.0 / 3.0},
          {"critic/score/mean", std::nextafter(1.0, 2.0) * d},
          {"edge/min_subnormal", std::numeric_limits<double>::denorm_min()},
          {"edge/max", std::numeric_limits<double>::max()},
          {"edge/negative_zero", -0.0},
          {"edge/nan", std::numeric_limits<double>::quiet_NaN()},
          {"edge/minus_inf", -std::numeric_limits<double>::infinity()},
          {"count/tokens", int64_t{1} << 53},
          {"count/negative", int64_t{-7} * step},
          {"flag/done", step == 3},
          {"text/name", "not a number"},
          {"missing", nullptr},
          {"list", nlohmann::json::array({1, 2})}};
}

double logged_as_double(const nlohmann::json& value) {
  if (value.is_boolean()) return value.get<bool>() ? 1.0 : 0.0;
  if (value.is_number_integer()) return static_cast<double>(value.get<int64_t>());
  return value.get<double>();
}

}  // namespace

TEST_CASE("crc32c matches the published CRC-32C check values") {
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);    // RFC 3720 B.4: 32 bytes of zeros
  CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43u);  // 32 bytes of ones
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  CHECK(crc32c(ascending) == 0x46DD794Eu);
  CHECK(crc32c(descending) == 0x113FDB5Cu);
  CHECK(crc32c("The quick brown fox jumps over the lazy dog") == 0x22620404u);
  CHECK(masked_crc32c("123456789") == masked("123456789"));
}

TEST_CASE("a framed record is length, masked CRC of the length, data, masked CRC of the data") {
  const std::string data = "hyflow event";
  CHECK(frame_tfrecord(data) ==
        le_bytes(data.size(), 8) + le_bytes(masked(le_bytes(data.size(), 8)), 4) + data + le_bytes(masked(data), 4));
  CHECK(parse_framing(frame_tfrecord("")) == std::vector<std::string>{""});
}

TEST_CASE("a run through Tracking reads back with protobuf's parser: version, config, steps, exact float32 values") {
  TempDir tmp("run");
  const double before = now();
  {
    Tracking tracking({"tensorboard"}, run_in(tmp.path));
    tracking.log_config({{"trainer", {{"logger", {"console", "tensorboard"}}, {"total_training_steps", 3}}},
                         {"actor", {{"lr", 5e-4}}}});
    for (int64_t step = 1; step <= 3; ++step) tracking.log(step_metrics(step), step);
    tracking.close();
  }
  const double after = now();
  const auto files = event_files(tmp.path / "tensorboard");
  REQUIRE(files.size() == 1);
  std::string pid_part = ".";  // events.out.tfevents.<seconds>.<host>.<pid>.<n>
  pid_part += std::to_string(::getpid());
  pid_part += ".";
  CHECK_THAT(files[0].filename().string(), Contains(pid_part));

  const auto events = parse_events(files[0]);
  REQUIRE(events.size() == 5);  // version, config, 3 steps
  for (const auto& event : events) {
    CHECK(event.wall_time() >= std::floor(before));
    CHECK(event.wall_time() <= after);
  }
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[0].step() == 0);
  CHECK(events[0].wall_time() <= events[1].wall_time());

  SECTION("the config is a text summary at step 0") {
    const pb::Event& config = events[1];
    CHECK(config.step() == 0);
    REQUIRE(config.summary().value_size() == 1);
    const auto& value = config.summary().value(0);
    CHECK(value.tag() == "config");
    CHECK(value.metadata().plugin_data().plugin_name() == "text");
    CHECK(value.metadata().data_class() == pb::DATA_CLASS_TENSOR);
    CHECK(value.tensor().dtype() == pb::DT_STRING);
    CHECK(value.tensor().tensor_shape().dim_size() == 0);
    REQUIRE(value.tensor().string_val_size() == 1);
    const std::string& text = value.tensor().string_val(0);
    CHECK_THAT(text, Contains("    {\n") && Contains("        \"lr\": 0.0005") && Contains("\"tensorboard\""));
  }

  SECTION("each step is one event whose values are the logged numbers as float32, bit for bit") {
    std::set<std::string> described;
    for (int64_t step = 1; step <= 3; ++step) {
      const pb::Event& event = events[static_cast<size_t>(step) + 1];
      CHECK(event.step() == step);
      const nlohmann::json logged = step_metrics(step);
      std::map<std::string, float> expected;  // each logged double rounded once to float32
      for (const auto& [tag, value] : logged.items())
        if (value.is_number() || value.is_boolean()) expected[tag] = static_cast<float>(logged_as_double(value));
      std::map<std::string, float> written;
      for (const auto& value : event.summary().value()) {
        INFO("step " << step << " tag " << value.tag());
        CHECK(value.tensor().dtype() == pb::DT_FLOAT);
        CHECK(value.tensor().tensor_shape().dim_size() == 0);
        REQUIRE(value.tensor().float_val_size() == 1);
        CHECK(value.tensor().double_val_size() == 0);
        if (described.insert(value.tag()).second) {  // TensorBoard reads a tag's metadata from its first value
          CHECK(value.metadata().plugin_data().plugin_name() == "scalars");
          CHECK(value.metadata().data_class() == pb::DATA_CLASS_SCALAR);
        }
        CHECK(written.emplace(value.tag(), value.tensor().float_val(0)).second);
      }
      REQUIRE(written.size() == expected.size());
      for (const auto& [tag, value] : expected) {
        INFO("step " << step << " tag " << tag);
        REQUIRE(written.count(tag) == 1);
        CHECK(std::bit_cast<uint32_t>(written.at(tag)) == std::bit_cast<uint32_t>(value));
      }
    }
    CHECK(described.size() == 10);
  }

  SECTION("hyflow's reader returns the same records and no damaged tail") {
    const TfRecords read = read_tfrecords(files[0]);
    CHECK(read.records == parse_framing(read_bytes(files[0])));
    CHECK_FALSE(read.truncated);
    CHECK(read.valid_bytes == fs::file_size(files[0]));
  }
}

TEST_CASE("every record written before a crash reads back; a cut-off tail is reported, a bad CRC refused") {
  TempDir tmp("damage");
  fs::path file;
  {
    TensorBoardTracker tracker(run_in(tmp.path));
    for (int64_t step = 1; step <= 3; ++step) tracker.log(step_metrics(step), step);
    file = tracker.event_file();
    // No close(): the records are on disk as soon as log() returns.
    const auto events = parse_events(file);
    REQUIRE(events.size() == 4);
    CHECK(events.back().step() == 3);
  }
  const std::string bytes = read_bytes(file);
  const auto records = parse_framing(bytes);
  REQUIRE(records.size() == 4);
  const uint64_t last_start = bytes.size() - (16 + records.back().size());
  const fs::path damaged = tmp.path / "damaged.tfevents";

  SECTION("cut inside the last record's data: the three records before it, and the tail reported") {
    write_bytes(damaged, bytes.substr(0, bytes.size() - 5));
    const TfRecords read = read_tfrecords(damaged);
    CHECK(read.truncated);
    CHECK(read.valid_bytes == last_start);
    REQUIRE(read.records.size() == 3);
    CHECK(read.records == std::vector<std::string>(records.begin(), records.begin() + 3));
    pb::Event event;
    REQUIRE(event.ParseFromString(read.records[2]));
    CHECK(event.step() == 2);
  }
  SECTION("cut inside the last record's header") {
    write_bytes(damaged, bytes.substr(0, last_start + 7));
    const TfRecords read = read_tfrecords(damaged);
    CHECK(read.truncated);
    CHECK(read.records.size() == 3);
  }
  SECTION("a length far beyond the file is a truncated tail, not an allocation") {
    const std::string huge = le_bytes(uint64_t{1} << 62, 8);
    write_bytes(damaged, bytes + huge + le_bytes(masked(huge), 4) + "xyz");
    const TfRecords read = read_tfrecords(damaged);
    CHECK(read.truncated);
    CHECK(read.valid_bytes == bytes.size());
    CHECK(read.records.size() == 4);
  }
  SECTION("a flipped byte of a data CRC in the middle is a FormatError naming the file and offset") {
    std::string flipped = bytes;
    const uint64_t second_start = 16 + records[0].size();
    const uint64_t data_crc = second_start + 12 + records[1].size();
    flipped[data_crc] = static_cast<char>(flipped[data_crc] ^ 0x01);
    write_bytes(damaged, flipped);
    CHECK_THROWS_WITH(read_tfrecords(damaged), Contains(damaged.string()) &&
                                                   Contains("record at byte " + std::to_string(second_start)) &&
                                                   Contains("CRC of its " + std::to_string(records[1].size())));
  }
  SECTION("a flipped byte of a length CRC is a FormatError") {
    std::string flipped = bytes;
    flipped[8] = static_cast<char>(flipped[8] ^ 0x80);
    write_bytes(damaged, flipped);
    CHECK_THROWS_AS(read_tfrecords(damaged), FormatError);
    CHECK_THROWS_WITH(read_tfrecords(damaged), Contains("record at byte 0") && Contains("CRC of its length"));
  }
  SECTION("an empty file has no records and no tail") {
    write_bytes(damaged, "");
    const TfRecords read = read_tfrecords(damaged);
    CHECK(read.records.empty());
    CHECK_FALSE(read.truncated);
  }
}

TEST_CASE("TENSORBOARD_DIR, when set, is the folder; otherwise {default_local_dir}/tensorboard") {
  TempDir tmp("dir");
  CHECK(tensorboard_dir(run_in(tmp.path)) == tmp.path / "tensorboard");
  ::setenv("TENSORBOARD_DIR", (tmp.path / "from_env").c_str(), 1);
  CHECK(tensorboard_dir(run_in(tmp.path)) == tmp.path / "from_env");
  TensorBoardTracker tracker(run_in(tmp.path));
  CHECK(tracker.event_file().parent_path() == tmp.path / "from_env");
  tracker.close();
  ::unsetenv("TENSORBOARD_DIR");
  CHECK_THROWS_AS(tensorboard_dir(RunInfo{}), ValueError);
}

TEST_CASE("a fresh run moves an earlier run's files aside; a resumed run adds a file restarting at S + 1") {
  TempDir tmp("resume");
  const fs::path dir = tmp.path / "tensorboard";
  const auto run_steps = [&](int64_t resumed, int64_t first, int64_t last) {
    TensorBoardTracker tracker(run_in(tmp.path, resumed));
    for (int64_t step = first; step <= last; ++step) tracker.log({{"loss", 1.0 / static_cast<double>(step)}}, step);
    tracker.close();
    return tracker.event_file();
  };
  const fs::path first = run_steps(0, 1, 4);
  const fs::path resumed = run_steps(2, 3, 5);  // checkpoint at step 2; the first run got to 4
  CHECK(event_files(dir) == std::vector<fs::path>{std::min(first, resumed), std::max(first, resumed)});
  const auto events = parse_events(resumed);
  REQUIRE(events.size() == 5);  // version, restart, steps 3..5
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[1].has_session_log());
  CHECK(events[1].session_log().status() == pb::SessionLog::START);
  CHECK(events[1].step() == 3);
  CHECK(events[2].step() == 3);

  const fs::path fresh = run_steps(0, 1, 1);
  CHECK(event_files(dir) == std::vector<fs::path>{fresh});
  CHECK(event_files(dir.string() + ".old").size() == 2);
  CHECK(parse_events(fresh)[0].file_version() == "brain.Event:2");
  fs::remove_all(dir.string() + ".old");
}

TEST_CASE("two trackers of one process in the same second get two files") {
  TempDir tmp("names");
  TensorBoardTracker a(run_in(tmp.path, 1)), b(run_in(tmp.path, 1));
  CHECK(a.event_file() != b.event_file());
  CHECK(event_files(tmp.path / "tensorboard").size() == 2);
}

// The sample run that check_tensorboard.py reads with Python's protobuf (CTest runs it first, with
// HYFLOW_TENSORBOARD_SAMPLE naming an empty folder). The values are recomputed in Python.
TEST_CASE("writes the sample run for check_tensorboard.py", "[.python]") {
  const char* folder = std::getenv("HYFLOW_TENSORBOARD_SAMPLE");
  REQUIRE(folder != nullptr);
  fs::remove_all(folder);
  ::setenv("TENSORBOARD_DIR", folder, 1);
  Tracking tracking({"tensorboard"}, run_in(fs::temp_directory_path()));
  tracking.log_config({{"trainer", {{"total_training_steps", 2}}}});
  for (int64_t step = 1; step <= 2; ++step) {
    const double d = static_cast<double>(step);
    tracking.log({{"actor/pg_loss", 0.1 * d + 1.0 / 3.0},
                  {"critic/score/mean", std::nextafter(1.0, 2.0) * d},
                  {"edge/min_subnormal", std::numeric_limits<double>::denorm_min()},
                  {"edge/max", std::numeric_limits<double>::max()},
                  {"edge/negative_zero", -0.0},
                  {"count/tokens", int64_t{1} << 53},
                  {"flag/done", step == 2},
                  {"text/name", "skipped"}},
                 step);
  }
  tracking.close();
  ::unsetenv("TENSORBOARD_DIR");
  CHECK(event_files(folder).size() == 1);
}
