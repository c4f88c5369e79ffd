#pragma once
// The code-execution tool: the model sends Python source (verl's sandbox_fusion schema, one
// string argument `code`), the tool runs it in the Sandbox and answers with its stdout and
// stderr. A non-zero exit, a limit or a sandbox failure is answered as text as well (status error,
// or timeout for the wall-time and CPU-time limits), never thrown at the agent loop.
// Config keys (tool config's `config` map; verl's names where verl has them):
//   default_timeout (s, 10), memory_limit_mb (512), num_workers (concurrent runs, 4),
//   default_language ("python" only), cpu_seconds (5), max_processes (32), max_output_bytes
//   (65536), max_file_mb (16), tmp_mb (64). Guide: docs/agents-tools.md.

#include <hyflow/agents/sandbox.hpp>
#include <hyflow/agents/tool.hpp>

#include <condition_variable>
#include <mutex>

namespace hyflow::agents {

/// The registered class name (a tool config's `class_name`).
inline constexpr const char* kCodeToolClass = "hyflow.tools.CodeInterpreterTool";

/// verl's code-interpreter schema: function `code_interpreter`, one required string `code`.
ToolSchema code_tool_schema();

struct CodeToolOptions {
  SandboxLimits limits;
  int num_workers = 4;  ///< programs run at once by this tool; more calls wait

  /// From a tool config's `config` map; ValueError naming an unknown key or a bad value.
  static CodeToolOptions from_config(const nlohmann::json& config);
};

class CodeTool final : public Tool {
 public:
  /// SandboxUnavailable when bwrap is missing (naming the Debian package).
  CodeTool(ToolSchema schema, CodeToolOptions options, SandboxOptions sandbox = {});

  ToolResult execute(const std::string& instance_id, const nlohmann::json& arguments) override;

  const CodeToolOptions& options() const { return options_; }

 private:
  CodeToolOptions options_;
  Sandbox sandbox_;
  std::mutex mu_;
  std::condition_variable slot_free_;
  int running_ = 0;
};

/// Registers kCodeToolClass (once; later calls do nothing).
void register_code_tool();

}  // namespace hyflow::agents
