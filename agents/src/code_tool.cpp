#include <hyflow/agents/code_tool.hpp>
#include <hyflow/core/error.hpp>

#include <algorithm>
#include <array>
#include <string_view>

namespace hyflow::agents {
namespace {

constexpr std::array<std::string_view, 9> kKeys = {"default_timeout",  "memory_limit_mb", "num_workers",
                                                   "default_language", "cpu_seconds",     "max_processes",
                                                   "max_output_bytes", "max_file_mb",     "tmp_mb"};

std::string where(const std::string& key) {
  return std::string(kCodeToolClass) + " config key '" + key + "'";
}

double positive_number(const nlohmann::json& config, const std::string& key, double fallback) {
  auto it = config.find(key);
  if (it == config.end()) return fallback;
  if (!it->is_number() || it->get<double>() <= 0)
    throw ValueError(where(key) + ": expected a positive number, got " + it->dump());
  return it->get<double>();
}

int64_t positive_integer(const nlohmann::json& config, const std::string& key, int64_t fallback) {
  auto it = config.find(key);
  if (it == config.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() <= 0)
    throw ValueError(where(key) + ": expected a positive integer, got " + it->dump());
  return it->get<int64_t>();
}

/// The model's view of a run: its output, and a bracketed line on what stopped it.
std::string tool_text(const SandboxResult& r, const SandboxLimits& limits) {
  std::string text = r.stdout_text;
  if (r.stdout_truncated) text += "\n[stdout truncated at " + std::to_string(limits.max_output_bytes) + " bytes]\n";
  text += r.stderr_text;
  if (r.stderr_truncated) text += "\n[stderr truncated at " + std::to_string(limits.max_output_bytes) + " bytes]\n";
  if (!r.ok()) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += '[';
    text += r.describe(limits);
    text += ']';
  }
  return text;
}

}  // namespace

ToolSchema code_tool_schema() {
  return ToolSchema{
      .name = "code_interpreter",
      .description = "Runs Python 3 code in a sandbox and returns what it prints (stdout and stderr).",
      .parameters = {{"type", "object"},
                     {"properties", {{"code", {{"type", "string"}, {"description", "The Python code to run."}}}}},
                     {"required", {"code"}}}};
}

CodeToolOptions CodeToolOptions::from_config(const nlohmann::json& config) {
  if (config.is_null()) return {};
  if (!config.is_object())
    throw ValueError(std::string(kCodeToolClass) + " config: expected a map, got " + config.dump());
  for (const auto& [key, value] : config.items()) {
    if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end()) {
      std::string known;
      for (auto k : kKeys) known += (known.empty() ? "" : ", ") + std::string(k);
      throw ValueError(where(key) + " is unknown; known keys: " + known);
    }
  }
  if (config.contains("default_language") && config["default_language"] != "python")
    throw ValueError(where("default_language") + ": only \"python\" is supported, got " +
                     config["default_language"].dump());
  CodeToolOptions o;
  SandboxLimits& l = o.limits;
  l.wall_seconds = positive_number(config, "default_timeout", l.wall_seconds);
  l.memory_bytes = static_cast<size_t>(positive_integer(config, "memory_limit_mb", int64_t(l.memory_bytes >> 20)))
                   << 20;
  o.num_workers = static_cast<int>(positive_integer(config, "num_workers", o.num_workers));
  l.cpu_seconds = static_cast<int>(positive_integer(config, "cpu_seconds", l.cpu_seconds));
  l.max_processes = static_cast<int>(positive_integer(config, "max_processes", l.max_processes));
  l.max_output_bytes = static_cast<size_t>(positive_integer(config, "max_output_bytes", int64_t(l.max_output_bytes)));
  l.max_file_bytes = static_cast<size_t>(positive_integer(config, "max_file_mb", int64_t(l.max_file_bytes >> 20)))
                     << 20;
  l.tmp_bytes = static_cast<size_t>(positive_integer(config, "tmp_mb", int64_t(l.tmp_bytes >> 20))) << 20;
  return o;
}

CodeTool::CodeTool(ToolSchema schema, CodeToolOptions options, SandboxOptions sandbox)
    : Tool(std::move(schema)), options_(std::move(options)), sandbox_(std::move(sandbox)) {}

ToolResult CodeTool::execute(const std::string& instance_id, const nlohmann::json& arguments) {
  (void)instance_id;
  auto code = arguments.find("code");
  if (!arguments.is_object() || code == arguments.end() || !code->is_string())
    return {.text = "Error: " + schema().name + " needs the argument 'code' (a string of Python code).",
            .status = ToolStatus::error};
  {
    std::unique_lock lock(mu_);
    slot_free_.wait(lock, [&] { return running_ < options_.num_workers; });
    ++running_;
  }
  struct Release {
    CodeTool* tool;
    ~Release() {
      {
        std::lock_guard lock(tool->mu_);
        --tool->running_;
      }
      tool->slot_free_.notify_one();
    }
  } release{this};
  SandboxResult r;
  try {
    r = sandbox_.run_python(code->get<std::string>(), options_.limits);
  } catch (const Error& e) {
    return {.text = std::string("Error: the sandbox could not run the code: ") + e.what(), .status = ToolStatus::error};
  }
  ToolResult out{.text = tool_text(r, options_.limits)};
  if (r.limit == SandboxLimit::wall_time || r.limit == SandboxLimit::cpu_time)
    out.status = ToolStatus::timeout;
  else if (!r.ok())
    out.status = ToolStatus::error;
  out.metrics = {{"exit_code", r.exit_code},     {"signal", r.signal},
                 {"limit", to_string(r.limit)},  {"wall_seconds", r.wall_seconds},
                 {"cpu_seconds", r.cpu_seconds}, {"output_truncated", r.stdout_truncated || r.stderr_truncated}};
  return out;
}

void register_code_tool() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_tool(kCodeToolClass, [](const nlohmann::json& config, ToolSchema schema) {
      return std::make_unique<CodeTool>(std::move(schema), CodeToolOptions::from_config(config));
    });
  });
}

}  // namespace hyflow::agents
