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

#include "spawn_attr.hpp"

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

namespace {

/// The pipes and socket pairs of one run: the program's stdin, stdout, stderr, bwrap's JSON status
/// and one per /tmp file.
struct Channels {
  Channel in = input_channel();
  Channel out = output_channel();
  Channel err = output_channel();
  Channel status = output_channel();
  std::vector<Channel> files;

  explicit Channels(size_t n_files) {
    files.reserve(n_files);
    for (size_t i = 0; i < n_files; ++i) files.push_back(input_channel());
  }
  void close_child_ends() {
    in.child.reset();
    out.child.reset();
    err.child.reset();
    status.child.reset();
    for (auto& f : files) f.child.reset();
  }
};

/// [setpriv ... --] bwrap <namespaces, mounts, files> -- prlimit <limits> -- <program>.
std::vector<std::string> sandbox_args(const std::string& setpriv, int uid, const std::string& bwrap,
                                      const std::string& prlimit, const SandboxCommand& command,
                                      const SandboxLimits& limits, const Channels& channels) {
  std::vector<std::string> args;
  auto add = [&args](std::initializer_list<std::string> more) { args.insert(args.end(), more); };
  if (!setpriv.empty())
    add({setpriv, "--reuid=" + std::to_string(uid), "--regid=" + std::to_string(uid), "--clear-groups", "--"});
  add({bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"});
  add({"--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"});
  for (const auto& [key, value] : command.env) add({"--setenv", key, value});
  add({"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin"});
  add({"--symlink", "usr/lib", "/lib"});
  if (::access("/usr/lib64", F_OK) == 0) add({"--symlink", "usr/lib64", "/lib64"});
  add({"--proc", "/proc", "--dev", "/dev", "--size", std::to_string(limits.tmp_bytes), "--tmpfs", "/tmp"});
  for (size_t i = 0; i < channels.files.size(); ++i)
    add({"--file", std::to_string(channels.files[i].child.get()), "/tmp/" + command.files[i].name});
  add({"--remount-ro", "/", "--chdir", "/tmp", "--json-status-fd", std::to_string(channels.status.child.get()), "--"});
  add({prlimit, "--cpu=" + std::to_string(limits.cpu_seconds) + ":" + std::to_string(limits.cpu_seconds + 1),
       "--as=" + std::to_string(limits.memory_bytes), "--nproc=" + std::to_string(limits.max_processes),
       "--fsize=" + std::to_string(limits.max_file_bytes), "--nofile=" + std::to_string(limits.max_open_files),
       "--core=0", "--"});
  args.insert(args.end(), command.argv.begin(), command.argv.end());
  return args;
}

/// posix_spawn in a new process group with default signal dispositions, an empty signal mask and
/// the channels' child ends in place. Everything it needs is built before the call.
pid_t spawn_in_new_group(std::vector<std::string>& args, const Channels& channels) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string path_env = "PATH=/usr/bin:/bin";
  char* envp[] = {path_env.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  detail::init_group_spawn_attr(attr);
  posix_spawn_file_actions_adddup2(&actions, channels.in.child.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, channels.out.child.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, channels.err.child.get(), 2);
  // dup2 onto itself clears close-on-exec (POSIX 2017, glibc >= 2.29): these fds bwrap reads or writes.
  posix_spawn_file_actions_adddup2(&actions, channels.status.child.get(), channels.status.child.get());
  for (const auto& f : channels.files) posix_spawn_file_actions_adddup2(&actions, f.child.get(), f.child.get());
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw SandboxUnavailable("sandbox: cannot start '" + args[0] + "': " + errno_text(rc));
  return pid;
}

/// Feeds the inputs and drains the outputs until stdout and stderr close (none), an output cap is
/// exceeded (output_size) or the deadline passes (wall_time).
class Pump {
 public:
  Pump(Channels& channels, const SandboxCommand& command, size_t max_output)
      : out{.cap = max_output}, err{.cap = max_output}, status{.cap = 4096} {
    inputs_.push_back({std::move(channels.in.parent), &command.stdin_text});
    for (size_t i = 0; i < channels.files.size(); ++i)
      inputs_.push_back({std::move(channels.files[i].parent), &command.files[i].content});
    for (auto& input : inputs_)
      if (input.data->empty()) input.fd.reset();
    readers_.push_back({std::move(channels.out.parent), &out});
    readers_.push_back({std::move(channels.err.parent), &err});
    readers_.push_back({std::move(channels.status.parent), &status});
  }

  SandboxLimit run(Clock::time_point deadline) {
    while (readers_[0].fd || readers_[1].fd) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return SandboxLimit::wall_time;
      std::vector<pollfd> fds;
      for (auto& r : readers_) fds.push_back({r.fd.get(), POLLIN, 0});  // a closed one (-1) is skipped
      for (auto& input : inputs_) fds.push_back({input.fd.get(), POLLOUT, 0});
      const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 1000)));
      if (ready < 0 && errno != EINTR) throw Error("sandbox: poll failed: " + errno_text(errno));
      for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (i < readers_.size() && read_some(readers_[i]) == Read::over_cap) return SandboxLimit::output_size;
        if (i >= readers_.size()) write_some(inputs_[i - readers_.size()]);
      }
    }
    return SandboxLimit::none;
  }

  /// What bwrap's status pipe still holds once bwrap has exited.
  void drain_status() {
    while (readers_[2].fd && read_some(readers_[2]) == Read::more) {
    }
  }

  Output out, err, status;

 private:
  struct Reader {
    Fd fd;
    Output* buf;
  };

  enum class Read { more, nothing_now, closed, over_cap };

  /// One read; over_cap when a program stream exceeded its cap (the status stream just stops growing).
  Read read_some(Reader& r) {
    const ssize_t n = ::read(r.fd.get(), chunk_.data(), chunk_.size());
    if (n > 0)
      return r.buf->append(chunk_.data(), static_cast<size_t>(n)) || r.buf == &status ? Read::more : Read::over_cap;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Read::nothing_now;
    r.fd.reset();
    return Read::closed;
  }

  static void write_some(Input& input) {
    const std::string& data = *input.data;
    const ssize_t n =
        ::send(input.fd.get(), data.data() + input.offset, data.size() - input.offset, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) input.offset += static_cast<size_t>(n);
    if ((n < 0 && errno != EAGAIN && errno != EINTR) || input.offset == data.size()) input.fd.reset();
  }

  std::vector<Input> inputs_;
  std::vector<Reader> readers_;
  std::vector<char> chunk_ = std::vector<char>(size_t{64} << 10);
};

/// The program's exit status or signal (bwrap reports a program killed by signal N as 128 + N) and
/// the limit that explains a signal.
void read_exit(int wstatus, const SandboxLimits& limits, SandboxResult& result) {
  if (WIFSIGNALED(wstatus)) {
    result.signal = WTERMSIG(wstatus);
  } else if (WIFEXITED(wstatus)) {
    const int code = WEXITSTATUS(wstatus);
    if (code > 128 && code < 128 + NSIG)
      result.signal = code - 128;
    else
      result.exit_code = code;
  }
  if (result.limit != SandboxLimit::none) return;
  if (result.signal == SIGXCPU ||
      (result.signal == SIGKILL && result.cpu_seconds >= static_cast<double>(limits.cpu_seconds)))
    result.limit = SandboxLimit::cpu_time;
  else if (result.signal == SIGXFSZ)
    result.limit = SandboxLimit::file_size;
}

}  // namespace

SandboxResult Sandbox::run(const SandboxCommand& command, const SandboxLimits& limits) const {
  check_command(command);
  check_limits(limits);
  Channels channels(command.files.size());
  auto args = sandbox_args(setpriv_, options_.unprivileged_uid, bwrap_, options_.prlimit, command, limits, channels);
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits.wall_seconds));
  const pid_t pid = spawn_in_new_group(args, channels);
  channels.close_child_ends();

  SandboxResult result;
  Pump pump(channels, command, limits.max_output_bytes);
  result.limit = pump.run(deadline);
  // A program that closed its output may still run until the deadline.
  int wstatus = 0;
  rusage usage{};
  bool reaped = false;
  while (result.limit == SandboxLimit::none && !reaped) {
    reaped = ::wait4(pid, &wstatus, WNOHANG, &usage) == pid;
    if (!reaped && Clock::now() >= deadline) result.limit = SandboxLimit::wall_time;
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!reaped) {
    // The group holds setpriv/bwrap; bwrap's --die-with-parent takes the sandbox's pid namespace down.
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    while (::wait4(pid, &wstatus, 0, &usage) < 0 && errno == EINTR) {
    }
  }
  pump.drain_status();
  // bwrap's {"child-pid": N}: it started the sandbox, whose init is N.
  const pid_t init = sandbox_init_pid(pump.status.text);
  if (!reaped && init > 0) wait_sandbox_gone(init);
  if (init <= 0 && result.limit == SandboxLimit::none)
    throw SandboxUnavailable("sandbox: bwrap could not set up the sandbox: " + pump.err.text);

  result.timed_out = result.limit == SandboxLimit::wall_time;
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.cpu_seconds = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  result.stdout_text = std::move(pump.out.text);
  result.stderr_text = std::move(pump.err.text);
  result.stdout_truncated = pump.out.truncated;
  result.stderr_truncated = pump.err.truncated;
  read_exit(wstatus, limits, result);
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
