// The sandbox: argv for setpriv/bwrap/prlimit built before the spawn, posix_spawn (no allocation
// in the child), then one poll loop that feeds stdin and the /tmp files, reads stdout, stderr and
// bwrap's JSON status with caps, and kills the process group at the wall-time deadline.
#include <hyflow/agents/sandbox.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

extern char** environ;

namespace hyflow::agents {
namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(int err) {
  return std::string(std::strerror(err));  // NOLINT(concurrency-mt-unsafe): glibc's is thread-safe for known errnos
}

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : std::string{};
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe)
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!dirs.empty()) {
    size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    dirs = colon == std::string_view::npos ? std::string_view{} : dirs.substr(colon + 1);
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

/// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// A pipe (parent reads) or a socket pair (parent writes: send() with MSG_NOSIGNAL, so a program
/// that exits without reading its stdin cannot SIGPIPE the caller). Both ends close on exec; the
/// spawn's file actions give the child its end.
struct Channel {
  Fd parent;
  Fd child;
};

Channel output_channel() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw Error("sandbox: pipe2 failed: " + errno_text(errno));
  Channel c{Fd(fds[0]), Fd(fds[1])};
  ::fcntl(c.parent.get(), F_SETFL, O_NONBLOCK);
  return c;
}

Channel input_channel() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    throw Error("sandbox: socketpair failed: " + errno_text(errno));
  Channel c{Fd(fds[0]), Fd(fds[1])};
  ::shutdown(c.child.get(), SHUT_WR);
  ::fcntl(c.parent.get(), F_SETFL, O_NONBLOCK);
  return c;
}

void check_command(const SandboxCommand& command) {
  if (command.argv.empty() || command.argv.front().empty()) throw ValueError("sandbox: the command's argv is empty");
  for (const auto& file : command.files)
    if (file.name.empty() || file.name == "." || file.name == ".." || file.name.find('/') != std::string::npos ||
        file.name.find('\0') != std::string::npos)
      throw ValueError("sandbox: file name '" + file.name + "' is not a plain file name");
  for (const auto& [key, value] : command.env)
    if (key.empty() || key.find('=') != std::string::npos)
      throw ValueError("sandbox: environment variable name '" + key + "' is empty or contains '='");
}

void check_limits(const SandboxLimits& l) {
  if (!(l.wall_seconds > 0) || l.cpu_seconds <= 0 || l.memory_bytes == 0 || l.max_processes <= 0 || l.tmp_bytes == 0 ||
      l.max_output_bytes == 0 || l.max_open_files <= 0)
    throw ValueError(
        "sandbox: every limit must be positive (wall_seconds, cpu_seconds, memory_bytes, "
        "max_processes, tmp_bytes, max_output_bytes, max_open_files)");
}

struct Output {
  std::string text;
  size_t cap = 0;
  bool truncated = false;

  /// Appends what fits; false when the cap is exceeded.
  bool append(const char* data, size_t n) {
    size_t room = cap > text.size() ? cap - text.size() : 0;
    text.append(data, std::min(room, n));
    if (n > room) truncated = true;
    return !truncated;
  }
};

struct Input {
  Fd fd;
  const std::string* data = nullptr;
  size_t offset = 0;
};

/// The pid of the sandbox's init from bwrap's `{"child-pid": N}`; 0 when absent.
pid_t sandbox_init_pid(const std::string& status) {
  size_t at = status.find("\"child-pid\"");
  if (at == std::string::npos) return 0;
  at = status.find(':', at);
  if (at == std::string::npos) return 0;
  return static_cast<pid_t>(std::strtol(status.c_str() + at + 1, nullptr, 10));
}

/// After bwrap was killed, its --die-with-parent kills the sandbox's init, and the kernel the
/// whole pid namespace with it; killing the init here as well and waiting (bounded) until it is
/// a zombie or gone means no process of the sandbox outlives run().
void wait_sandbox_gone(pid_t init) {
  ::kill(init, SIGKILL);
  const std::string stat_path = "/proc/" + std::to_string(init) + "/stat";
  const auto give_up = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < give_up) {
    Fd fd(::open(stat_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return;
    char buf[512];
    ssize_t n = ::read(fd.get(), buf, sizeof(buf) - 1);
    if (n <= 0) return;
    buf[n] = '\0';
    const char* paren = std::strrchr(buf, ')');  // "pid (comm) S ..."
    if (!paren || paren[1] == '\0' || paren[2] == 'Z' || paren[2] == 'X') return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string format_number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

double seconds(const timeval& tv) {
  return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
}

}  // namespace

const char* to_string(SandboxLimit limit) {
  switch (limit) {
    case SandboxLimit::none:
      return "none";
    case SandboxLimit::wall_time:
      return "wall_time";
    case SandboxLimit::cpu_time:
      return "cpu_time";
    case SandboxLimit::output_size:
      return "output_size";
    case SandboxLimit::file_size:
      return "file_size";
  }
  return "unknown";
}

std::string SandboxResult::describe(const SandboxLimits& limits) const {
  switch (limit) {
    case SandboxLimit::wall_time:
      return "killed: wall-time limit of " + format_number(limits.wall_seconds) + " s";
    case SandboxLimit::cpu_time:
      return "killed: CPU-time limit of " + std::to_string(limits.cpu_seconds) + " s";
    case SandboxLimit::output_size:
      return "killed: output over the limit of " + std::to_string(limits.max_output_bytes) + " bytes";
    case SandboxLimit::file_size:
      return "killed: file-size limit of " + std::to_string(limits.max_file_bytes) + " bytes";
    case SandboxLimit::none:
      break;
  }
  if (signal != 0) {
    const char* name = ::sigabbrev_np(signal);
    return "killed by signal " + std::to_string(signal) + (name ? std::string(" (SIG") + name + ")" : std::string{});
  }
  return "exit status " + std::to_string(exit_code);
}

Sandbox::Sandbox(SandboxOptions options) : options_(std::move(options)) {
  bwrap_ = find_program(options_.bwrap);
  if (bwrap_.empty())
    throw SandboxUnavailable("sandbox: '" + options_.bwrap +
                             "' (bubblewrap) is not installed; install the Debian package 'bubblewrap' "
                             "(scripts/install-deps.sh)");
  if (::access(options_.prlimit.c_str(), X_OK) != 0)
    throw SandboxUnavailable("sandbox: '" + options_.prlimit + "' is missing; install the Debian package 'util-linux'");
  if (::geteuid() == 0) {
    setpriv_ = find_program(options_.setpriv);
    if (setpriv_.empty())
      throw SandboxUnavailable("sandbox: running as root needs '" + options_.setpriv +
                               "' to drop to an unprivileged uid; install the Debian package 'util-linux'");
  }
}

SandboxResult Sandbox::run(const SandboxCommand& command, const SandboxLimits& limits) const {
  check_command(command);
  check_limits(limits);

  Channel in = input_channel();
  Channel out = output_channel();
  Channel err = output_channel();
  Channel status = output_channel();
  std::vector<Channel> files;
  files.reserve(command.files.size());
  for (size_t i = 0; i < command.files.size(); ++i) files.push_back(input_channel());

  // --- argv: [setpriv ... --] bwrap ... -- prlimit ... -- program ---------------------------
  std::vector<std::string> args;
  if (!setpriv_.empty()) {
    const std::string id = std::to_string(options_.unprivileged_uid);
    args = {setpriv_, "--reuid=" + id, "--regid=" + id, "--clear-groups", "--"};
  }
  auto add = [&args](std::initializer_list<std::string> more) { args.insert(args.end(), more); };
  add({bwrap_, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"});
  add({"--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"});
  for (const auto& [key, value] : command.env) add({"--setenv", key, value});
  add({"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin"});
  add({"--symlink", "usr/lib", "/lib"});
  if (::access("/usr/lib64", F_OK) == 0) add({"--symlink", "usr/lib64", "/lib64"});
  add({"--proc", "/proc", "--dev", "/dev", "--size", std::to_string(limits.tmp_bytes), "--tmpfs", "/tmp"});
  for (size_t i = 0; i < files.size(); ++i)
    add({"--file", std::to_string(files[i].child.get()), "/tmp/" + command.files[i].name});
  add({"--remount-ro", "/", "--chdir", "/tmp", "--json-status-fd", std::to_string(status.child.get()), "--"});
  const auto cpu = std::to_string(limits.cpu_seconds);
  add({options_.prlimit, "--cpu=" + cpu + ":" + std::to_string(limits.cpu_seconds + 1),
       "--as=" + std::to_string(limits.memory_bytes), "--nproc=" + std::to_string(limits.max_processes),
       "--fsize=" + std::to_string(limits.max_file_bytes), "--nofile=" + std::to_string(limits.max_open_files),
       "--core=0", "--"});
  args.insert(args.end(), command.argv.begin(), command.argv.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string path_env = "PATH=/usr/bin:/bin";
  char* envp[] = {path_env.data(), nullptr};

  // --- spawn: own process group, default signals, empty mask, the child's ends in place --------
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&actions, in.child.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, out.child.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err.child.get(), 2);
  // dup2 onto itself clears close-on-exec (POSIX 2017, glibc >= 2.29): these fds bwrap reads or writes.
  posix_spawn_file_actions_adddup2(&actions, status.child.get(), status.child.get());
  for (auto& f : files) posix_spawn_file_actions_adddup2(&actions, f.child.get(), f.child.get());
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  const auto start = Clock::now();
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw SandboxUnavailable("sandbox: cannot start '" + args[0] + "': " + errno_text(rc));
  in.child.reset();
  out.child.reset();
  err.child.reset();
  status.child.reset();
  for (auto& f : files) f.child.reset();

  // --- feed and drain until both output streams close, a cap is hit or the deadline passes ----
  SandboxResult result;
  Output stdout_buf{.cap = limits.max_output_bytes};
  Output stderr_buf{.cap = limits.max_output_bytes};
  Output status_buf{.cap = 4096};
  std::vector<Input> inputs;
  inputs.push_back({std::move(in.parent), &command.stdin_text});
  for (size_t i = 0; i < files.size(); ++i) inputs.push_back({std::move(files[i].parent), &command.files[i].content});
  struct Reader {
    Fd* fd;
    Output* buf;
  };
  std::vector<Reader> readers = {{&out.parent, &stdout_buf}, {&err.parent, &stderr_buf}, {&status.parent, &status_buf}};
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits.wall_seconds));
  bool kill_now = false;
  std::vector<char> chunk(size_t{64} << 10);
  for (auto& input : inputs)
    if (input.data->empty()) input.fd.reset();
  while (!kill_now && (out.parent || err.parent)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.timed_out = true;
      result.limit = SandboxLimit::wall_time;
      break;
    }
    std::vector<pollfd> fds;
    for (auto& r : readers)
      if (*r.fd) fds.push_back({r.fd->get(), POLLIN, 0});
    const size_t n_readers = fds.size();
    for (auto& input : inputs)
      if (input.fd) fds.push_back({input.fd.get(), POLLOUT, 0});
    int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) throw Error("sandbox: poll failed: " + errno_text(errno));
    if (ready <= 0) continue;
    for (size_t i = 0; i < fds.size() && !kill_now; ++i) {
      if (fds[i].revents == 0) continue;
      if (i < n_readers) {
        auto it =
            std::find_if(readers.begin(), readers.end(), [&](const Reader& r) { return r.fd->get() == fds[i].fd; });
        ssize_t n = ::read(fds[i].fd, chunk.data(), chunk.size());
        if (n > 0) {
          if (!it->buf->append(chunk.data(), static_cast<size_t>(n)) && it->buf != &status_buf) {
            result.limit = SandboxLimit::output_size;
            kill_now = true;
          }
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          it->fd->reset();
        }
      } else {
        auto it = std::find_if(inputs.begin(), inputs.end(), [&](const Input& in) { return in.fd.get() == fds[i].fd; });
        const std::string& data = *it->data;
        ssize_t n = ::send(fds[i].fd, data.data() + it->offset, data.size() - it->offset, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) it->offset += static_cast<size_t>(n);
        if ((n < 0 && errno != EAGAIN && errno != EINTR) || it->offset == data.size()) it->fd.reset();
      }
    }
  }

  // --- reap: a program that closed its output may still run until the deadline ---------------
  int wstatus = 0;
  rusage usage{};
  bool reaped = false;
  while (!kill_now && result.limit == SandboxLimit::none) {
    pid_t w = ::wait4(pid, &wstatus, WNOHANG, &usage);
    if (w == pid) {
      reaped = true;
      break;
    }
    if (Clock::now() >= deadline) {
      result.timed_out = true;
      result.limit = SandboxLimit::wall_time;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!reaped) {
    // The group holds setpriv/bwrap; bwrap's --die-with-parent takes the sandbox's pid namespace down.
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    while (::wait4(pid, &wstatus, 0, &usage) < 0 && errno == EINTR) {
    }
  }
  // What bwrap's status pipe got ("child-pid": it started the sandbox; that pid is the sandbox's init).
  for (ssize_t n = 1; status.parent && n > 0;) {
    n = ::read(status.parent.get(), chunk.data(), chunk.size());
    if (n > 0) status_buf.append(chunk.data(), static_cast<size_t>(n));
  }
  const pid_t init = sandbox_init_pid(status_buf.text);
  if (!reaped && init > 0) wait_sandbox_gone(init);
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.cpu_seconds = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  result.stdout_text = std::move(stdout_buf.text);
  result.stderr_text = std::move(stderr_buf.text);
  result.stdout_truncated = stdout_buf.truncated;
  result.stderr_truncated = stderr_buf.truncated;

  const bool started = init > 0;
  if (WIFSIGNALED(wstatus)) {
    result.signal = WTERMSIG(wstatus);
  } else if (WIFEXITED(wstatus)) {
    int code = WEXITSTATUS(wstatus);
    if (!started && result.limit == SandboxLimit::none)
      throw SandboxUnavailable("sandbox: bwrap could not set up the sandbox (exit status " + std::to_string(code) +
                               "): " + result.stderr_text);
    // bwrap reports a program killed by signal N as exit status 128 + N.
    if (code > 128 && code < 128 + NSIG)
      result.signal = code - 128;
    else
      result.exit_code = code;
  }
  if (result.limit == SandboxLimit::none) {
    if (result.signal == SIGXCPU ||
        (result.signal == SIGKILL && result.cpu_seconds >= static_cast<double>(limits.cpu_seconds)))
      result.limit = SandboxLimit::cpu_time;
    else if (result.signal == SIGXFSZ)
      result.limit = SandboxLimit::file_size;
  }
  return result;
}

SandboxResult Sandbox::run_python(const std::string& code, const SandboxLimits& limits,
                                  const std::string& stdin_text) const {
  SandboxCommand command{.argv = {"/usr/bin/python3", "-I", "main.py"},
                         .files = {{.name = "main.py", .content = code}},
                         .stdin_text = stdin_text};
  return run(command, limits);
}

}  // namespace hyflow::agents
