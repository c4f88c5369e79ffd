#pragma once
// A caf-node child process for tests: started with posix_spawn on port 0, its port read from
// the first stdout line, stopped (SIGTERM, then SIGKILL) in the destructor. Plus the other
// pieces the cluster tests share: a closed port and a networked Runtime.

#include <hyflow/actors/runtime.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace test {

/// A Runtime with CAF's middleman, as a controller of caf-nodes needs.
inline std::unique_ptr<hyflow::Runtime> network_runtime() {
  hyflow::RuntimeOptions o;
  o.network = true;
  return std::make_unique<hyflow::Runtime>(o);
}

/// A socket listening on a free port of 127.0.0.1 (a fake node or holder in a test); throws
/// std::runtime_error naming the call that failed.
struct LoopbackListener {
  int fd = -1;
  int port = 0;
};
inline LoopbackListener listen_on_loopback(int backlog) {
  LoopbackListener l;
  l.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(l.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l.fd, backlog) != 0 ||
      ::getsockname(l.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int err = errno;
    ::close(l.fd);
    throw std::runtime_error(std::string("listen on 127.0.0.1 failed: ") + std::strerror(err));
  }
  l.port = ntohs(a.sin_port);
  return l;
}

/// A loopback port nothing listens on: bound once, then closed again.
inline int closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

/// How a NodeProcess runs besides its flags.
struct NodeProcessOptions {
  std::string stderr_file;           ///< the node's log goes to this file (empty: this process's stderr)
  uint64_t address_space_limit = 0;  ///< the node's RLIMIT_AS in bytes, set by prlimit (0: none)
};

class NodeProcess {
 public:
  explicit NodeProcess(std::vector<std::string> extra_args = {}, const NodeProcessOptions& options = {}) {
    std::vector<std::string> args{CAF_NODE_PATH, "--port=0", "--bind=127.0.0.1", "--exit-with-parent"};
    const char* program = CAF_NODE_PATH;
    if (options.address_space_limit > 0) {  // prlimit sets the limit and execs the node (same pid)
      program = "/usr/bin/prlimit";
      args.insert(args.begin(), {program, "--as=" + std::to_string(options.address_space_limit), "--"});
    }
    for (auto& a : extra_args) args.push_back(std::move(a));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    if (!options.stderr_file.empty())
      posix_spawn_file_actions_addopen(&fa, 2, options.stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    // The child must not inherit this process's sockets (CAF connections, other children's pipes).
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    int rc = posix_spawn(&pid_, program, &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    if (rc != 0) {
      close(out[0]);
      throw std::runtime_error(std::string("cannot start ") + program);
    }
    fd_ = out[0];
    // First line: "caf-node listening on 127.0.0.1:PORT"
    try {
      port_ = read_port();
    } catch (...) {  // never leave a child behind
      kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
      close(fd_);
      throw;
    }
  }

 private:
  int read_port() {
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (line.find('\n') == std::string::npos) {
      pollfd p{fd_, POLLIN, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0)
        throw std::runtime_error("caf-node did not report its port within 20 s");
      char buf[256];
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw std::runtime_error("caf-node exited before listening (read " + std::to_string(n) + "): " + line);
      line.append(buf, static_cast<size_t>(n));
    }
    auto colon = line.rfind(':');
    return std::stoi(line.substr(colon + 1));
  }

 public:
  ~NodeProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGCONT);
      kill(pid_, SIGTERM);
      for (int i = 0; i < 100 && !reaped(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!reaped()) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status_, 0);
      }
    }
    if (fd_ >= 0) close(fd_);
  }
  NodeProcess(const NodeProcess&) = delete;
  NodeProcess& operator=(const NodeProcess&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  void signal(int sig) { kill(pid_, sig); }
  /// Waits up to `timeout` for the process to end; true with its exit status in `status`.
  bool wait_exit(std::chrono::milliseconds timeout, int& status) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (reaped()) {
        status = status_;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  bool reaped() {
    if (done_) return true;
    if (waitpid(pid_, &status_, WNOHANG) == pid_) done_ = true;
    return done_;
  }
  pid_t pid_ = -1;
  int fd_ = -1;
  int port_ = 0;
  int status_ = 0;
  bool done_ = false;
};

}  // namespace test
