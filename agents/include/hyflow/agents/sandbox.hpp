#pragma once
// Sandbox: runs an untrusted program (the model's Python code) under bubblewrap (`bwrap`, Debian
// package `bubblewrap`). Inside: no network (a new, empty network namespace), the system's /usr
// read-only and nothing else of the host (no /etc, /home, /root, /work), a size-limited tmpfs /tmp
// as the only writable place, new pid/ipc/uts/user namespaces, a new session, a clean environment.
// Limits: wall time (the whole sandbox killed), CPU time, address space, processes, file size and
// open files (rlimits set by util-linux's prlimit inside the sandbox's own user namespace, so the
// process count is the sandbox's alone), and output (at most max_output_bytes of stdout and of
// stderr are read; more kills the sandbox). Run as root, the sandbox drops to an unprivileged uid
// first (util-linux's setpriv), since root's process count is not limited. The calling process
// never allocates between fork and exec (posix_spawn); run() may be called from many threads.
// Guide: docs/agents-tools.md.

#include <hyflow/core/error.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::agents {

/// bwrap (or another program the sandbox needs) is not installed or cannot create its namespaces.
class SandboxUnavailable : public Error {
 public:
  using Error::Error;
};

struct SandboxLimits {
  double wall_seconds = 10.0;                  ///< then the whole sandbox is killed
  int cpu_seconds = 5;                         ///< RLIMIT_CPU per process (SIGXCPU, then SIGKILL a second later)
  size_t memory_bytes = size_t{512} << 20;     ///< RLIMIT_AS per process
  int max_processes = 32;                      ///< RLIMIT_NPROC in the sandbox's user namespace
  size_t max_file_bytes = size_t{16} << 20;    ///< RLIMIT_FSIZE: the largest file it may write
  size_t tmp_bytes = size_t{64} << 20;         ///< size of the tmpfs /tmp
  size_t max_output_bytes = size_t{64} << 10;  ///< per stream; more kills the sandbox
  int max_open_files = 256;                    ///< RLIMIT_NOFILE
};

/// A file placed in the sandbox's /tmp before the program starts.
struct SandboxFile {
  std::string name;  ///< a plain file name (no '/'), e.g. "main.py"
  std::string content;
};

struct SandboxCommand {
  std::vector<std::string> argv;  ///< inside the sandbox, e.g. {"/usr/bin/python3", "main.py"}; cwd is /tmp
  std::vector<SandboxFile> files;
  std::string stdin_text;
  std::vector<std::pair<std::string, std::string>> env;  ///< on top of PATH, HOME=/tmp, LANG=C.UTF-8
};

/// Which limit stopped the program, as far as the sandbox can tell. Memory, disk-full and
/// process-count limits make the program's own calls fail (MemoryError, ENOSPC, EAGAIN): those
/// show in its exit code and stderr, not here.
enum class SandboxLimit { none, wall_time, cpu_time, output_size, file_size };

const char* to_string(SandboxLimit limit);

struct SandboxResult {
  int exit_code = -1;  ///< the program's exit status; -1 when it was killed by a signal
  int signal = 0;      ///< the signal that ended the program, 0 when it exited
  std::string stdout_text;
  std::string stderr_text;
  bool stdout_truncated = false;  ///< more than max_output_bytes were written
  bool stderr_truncated = false;
  bool timed_out = false;  ///< the wall-time limit killed it
  SandboxLimit limit = SandboxLimit::none;
  double wall_seconds = 0.0;
  double cpu_seconds = 0.0;  ///< user + system time of the processes the sandbox reaped

  /// Exited with status 0 and no limit hit.
  bool ok() const { return exit_code == 0 && limit == SandboxLimit::none; }
  /// One line for a person or a model: "exit status 1", "killed: wall-time limit of 2 s", ...
  std::string describe(const SandboxLimits& limits) const;
};

struct SandboxOptions {
  std::string bwrap = "bwrap";               ///< a path, or a name looked up in PATH
  std::string prlimit = "/usr/bin/prlimit";  ///< inside the sandbox (the host's /usr)
  std::string setpriv = "setpriv";           ///< used only when running as root
  int unprivileged_uid = 65534;              ///< the uid (and gid) root drops to: nobody
};

class Sandbox {
 public:
  /// Finds bwrap (and setpriv when root); SandboxUnavailable naming the Debian package otherwise.
  explicit Sandbox(SandboxOptions options = {});

  /// Runs `command` to its end or to a limit. Throws SandboxUnavailable when bwrap cannot start
  /// the sandbox (e.g. user namespaces are disabled) and ValueError for a bad command; anything the
  /// program does is in the result.
  SandboxResult run(const SandboxCommand& command, const SandboxLimits& limits) const;

  /// Runs Python source with /usr/bin/python3 (-I: isolated mode) as /tmp/main.py.
  SandboxResult run_python(const std::string& code, const SandboxLimits& limits,
                           const std::string& stdin_text = {}) const;

  const std::string& bwrap_path() const { return bwrap_; }

 private:
  SandboxOptions options_;
  std::string bwrap_;
  std::string setpriv_;  ///< empty unless running as root
};

}  // namespace hyflow::agents
