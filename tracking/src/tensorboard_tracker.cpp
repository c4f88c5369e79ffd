// The tensorboard tracker: Event protos (hyflow.tensorboard, TensorFlow's field numbers) framed
// as TFRecords in an event file TensorBoard reads.
#include <hyflow/core/error.hpp>
#include <hyflow/core/files.hpp>
#include <hyflow/tracking/tensorboard_tracker.hpp>
#include <hyflow/tracking/tfrecord.hpp>

#include "hyflow/tensorboard/event.pb.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

namespace hyflow::tracking {

namespace fs = std::filesystem;
namespace pb = hyflow::tensorboard;

namespace {

constexpr const char* kFileVersion = "brain.Event:2";
constexpr const char* kConfigTag = "config";

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

bool is_event_file(const fs::path& path) {
  return path.filename().string().find("tfevents") != std::string::npos;
}

/// A fresh run moves the event files an earlier run left in `dir` aside, so that TensorBoard
/// does not draw the two runs as one.
void move_earlier_run(const fs::path& dir) {
  std::vector<fs::path> earlier;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && is_event_file(entry.path())) earlier.push_back(entry.path());
  if (earlier.empty()) return;
  const fs::path old = free_path(dir, ".old");
  fs::create_directories(old);
  for (const auto& file : earlier) fs::rename(file, old / file.filename());
  std::cout << "tensorboard: " << earlier.size() << " event file(s) of an earlier run moved to " << old.string()
            << "\n";
}

/// Opens a new event file in `dir`, never one that exists (n counts up, process-wide).
std::FILE* open_event_file(const fs::path& dir, fs::path& file) {
  static std::atomic<int> counter{0};
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string stem = "events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
                           std::to_string(static_cast<long>(getpid())) + ".";
  for (int attempt = 0; attempt < 1000; ++attempt) {
    file = dir / (stem + std::to_string(counter++));
    if (std::FILE* out = std::fopen(file.c_str(), "wbx")) return out;
    if (errno != EEXIST) throw Error("cannot create " + file.string() + ": " + std::strerror(errno));
  }
  throw Error("cannot create an event file in " + dir.string() + ": every name " + stem + "<n> is taken");
}

pb::SummaryMetadata plugin_metadata(const char* plugin, pb::DataClass data_class) {
  pb::SummaryMetadata metadata;
  metadata.mutable_plugin_data()->set_plugin_name(plugin);
  metadata.set_data_class(data_class);
  return metadata;
}

/// The metrics value as a double, or nothing for what is not a number or a boolean.
std::optional<double> numeric_value(const nlohmann::json& value) {
  if (value.is_boolean()) return value.get<bool>() ? 1.0 : 0.0;
  if (value.is_number_unsigned()) return static_cast<double>(value.get<uint64_t>());
  if (value.is_number_integer()) return static_cast<double>(value.get<int64_t>());
  if (value.is_number_float()) return value.get<double>();
  return std::nullopt;
}

/// The config as a Markdown code block (indented four spaces) for TensorBoard's text plugin.
std::string config_markdown(const nlohmann::json& config) {
  std::istringstream lines(config.dump(2));
  std::string text, line;
  while (std::getline(lines, line)) text += "    " + line + "\n";
  return text;
}

}  // namespace

fs::path tensorboard_dir(const RunInfo& run) {
  if (const char* env = std::getenv("TENSORBOARD_DIR"); env && *env) return env;
  if (run.local_dir.empty())
    throw ValueError("the tensorboard tracker needs TENSORBOARD_DIR or trainer.default_local_dir");
  return fs::path(run.local_dir) / "tensorboard";
}

TensorBoardTracker::TensorBoardTracker(const RunInfo& run) {
  fs::path dir = tensorboard_dir(run).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "runs/tb/" -> "runs/tb"
  fs::create_directories(dir);
  if (run.resumed_step == 0) move_earlier_run(dir);
  out_ = open_event_file(dir, file_);
  pb::Event version;
  version.set_wall_time(wall_time_now());
  version.set_file_version(kFileVersion);
  write_record(version.SerializeAsString());
  if (run.resumed_step > 0) {
    pb::Event restart;
    restart.set_wall_time(wall_time_now());
    restart.set_step(run.resumed_step + 1);
    restart.mutable_session_log()->set_status(pb::SessionLog::START);
    write_record(restart.SerializeAsString());
  }
}

TensorBoardTracker::~TensorBoardTracker() {
  if (out_) std::fclose(out_);
}

void TensorBoardTracker::log_config(const nlohmann::json& config) {
  pb::Event event;
  event.set_wall_time(wall_time_now());
  event.set_step(0);
  pb::Summary::Value* value = event.mutable_summary()->add_value();
  value->set_tag(kConfigTag);
  *value->mutable_metadata() = plugin_metadata("text", pb::DATA_CLASS_TENSOR);
  pb::TensorProto* tensor = value->mutable_tensor();
  tensor->set_dtype(pb::DT_STRING);
  tensor->mutable_tensor_shape();  // rank 0
  tensor->add_string_val(config_markdown(config));
  write_record(event.SerializeAsString());
}

void TensorBoardTracker::log(const nlohmann::json& metrics, int64_t step) {
  pb::Event event;
  event.set_wall_time(wall_time_now());
  event.set_step(step);
  pb::Summary* summary = event.mutable_summary();
  for (const auto& [tag, raw] : metrics.items()) {
    const auto number = numeric_value(raw);
    if (!number) continue;
    pb::Summary::Value* value = summary->add_value();
    value->set_tag(tag);
    if (tags_described_.insert(tag).second)
      *value->mutable_metadata() = plugin_metadata("scalars", pb::DATA_CLASS_SCALAR);
    pb::TensorProto* tensor = value->mutable_tensor();
    // float32, TensorBoard's scalar type: its data server keeps DT_FLOAT scalars only and drops
    // DT_DOUBLE ones, so a double here would leave the default TensorBoard's charts empty.
    tensor->set_dtype(pb::DT_FLOAT);
    tensor->mutable_tensor_shape();  // rank 0
    tensor->add_float_val(static_cast<float>(*number));
  }
  if (summary->value_size() > 0) write_record(event.SerializeAsString());
}

void TensorBoardTracker::write_record(const std::string& event) {
  if (!out_) throw ValueError("tensorboard: " + file_.string() + " is closed");
  const std::string record = frame_tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), out_) != record.size() || std::fflush(out_) != 0)
    throw Error("cannot write " + file_.string() + ": " + std::strerror(errno));
}

void TensorBoardTracker::flush() {
  if (out_ && std::fflush(out_) != 0) throw Error("cannot write " + file_.string() + ": " + std::strerror(errno));
}

void TensorBoardTracker::close() {
  if (!out_) return;
  std::FILE* out = out_;
  out_ = nullptr;
  if (std::fclose(out) != 0) throw Error("cannot close " + file_.string() + ": " + std::strerror(errno));
}

}  // namespace hyflow::tracking
