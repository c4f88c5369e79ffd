// The sandbox's basics and its drill: programs that read outside, open a socket, fork-bomb, fill
// the disk, print 1 GB, sleep forever, spin, allocate 4 GB. Each is stopped within its limits,
// the result says why, no process of it survives, and the test process goes on (also with all
// of them at once).
#include "common/processes.hpp"
#include "sandbox_fixture.hpp"

#include <hyflow/core/error.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <thread>
#include <vector>

using namespace hyflow;
using namespace hyflow::agents;
using hyflow::agents::testing::sandbox_or_skip;

namespace {

using hyflow::testing::processes_with;

SandboxLimits drill_limits() {
  return {.wall_seconds = 4.0,
          .cpu_seconds = 2,
          .memory_bytes = size_t{256} << 20,
          .max_processes = 16,
          .max_file_bytes = size_t{4} << 20,
          .tmp_bytes = size_t{8} << 20,
          .max_output_bytes = size_t{64} << 10,
          .max_open_files = 64};
}

SandboxLimits spin_limits() {
  SandboxLimits limits = drill_limits();
  limits.cpu_seconds = 1;
  limits.wall_seconds = 30.0;
  return limits;
}

std::string marker_for(const std::string& drill) {
  return "hyflow-drill-" + drill + "-" + std::to_string(::getpid());
}

/// A listening socket on the host's loopback that the sandbox must not reach.
struct HostListener {
  int fd = -1;
  int port = 0;
  HostListener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~HostListener() { ::close(fd); }
};

const char* kReadOutside = R"(
import os, sys
for path in sys.argv[2:]:
    try:
        if os.path.isdir(path):
            print("READ", path, os.listdir(path))
        else:
            print("READ", path, open(path).read(64))
    except OSError as e:
        print("blocked", path, type(e).__name__)
for path in ["/usr/evil", "/evil"]:
    try:
        open(path, "w").write("x")
        print("WROTE", path)
    except OSError as e:
        print("blocked write", path, type(e).__name__)
)";

const char* kSocket = R"(
import socket, sys
port = int(sys.argv[2])
for host in [("127.0.0.1", port), ("1.1.1.1", 53)]:
    try:
        socket.create_connection(host, timeout=1)
        print("CONNECTED", host)
    except OSError as e:
        print("blocked", host, type(e).__name__)
)";

const char* kForkBomb = R"(
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
)";

const char* kFillDisk = R"(
import errno
i = 0
while True:
    try:
        with open("/tmp/fill%d" % i, "wb") as f:
            while True:
                f.write(b"x" * (1 << 20))
                f.flush()
    except OSError as e:
        if e.errno != errno.EFBIG:
            raise
        i += 1
)";

const char* kPrint1G = R"(
import sys
chunk = "x" * (1 << 20)
for _ in range(1024):
    sys.stdout.write(chunk)
)";

const char* kSleep = "import time\ntime.sleep(10**6)\n";
const char* kSpin = "while True:\n    pass\n";
const char* kAllocate = "b = bytearray(4 << 30)\nprint('ALLOCATED', len(b))\n";

void check_read_outside(const SandboxResult& r) {
  INFO(r.stdout_text << r.stderr_text);
  CHECK(r.exit_code == 0);
  CHECK(r.stdout_text.find("READ") == std::string::npos);
  CHECK(r.stdout_text.find("WROTE") == std::string::npos);
  CHECK(r.stdout_text.find("blocked /etc/shadow") != std::string::npos);
  CHECK(r.stdout_text.find("blocked " HYFLOW_SOURCE_DIR) != std::string::npos);
  CHECK(r.stdout_text.find("blocked write /usr/evil") != std::string::npos);
  CHECK(r.stdout_text.find("blocked write /evil") != std::string::npos);
}

void check_socket(const SandboxResult& r) {
  INFO(r.stdout_text << r.stderr_text);
  CHECK(r.exit_code == 0);
  CHECK(r.stdout_text.find("CONNECTED") == std::string::npos);
  CHECK(r.stdout_text.find("blocked ('127.0.0.1'") != std::string::npos);
  CHECK(r.stdout_text.find("blocked ('1.1.1.1'") != std::string::npos);
}

void check_fork_bomb(const SandboxResult& r) {
  INFO(r.describe(drill_limits()) << "\n" << r.stderr_text);
  CHECK((r.limit == SandboxLimit::wall_time || r.limit == SandboxLimit::cpu_time));
  CHECK(r.wall_seconds < drill_limits().wall_seconds + 2.0);
}

void check_fill_disk(const SandboxResult& r) {
  INFO(r.stderr_text);
  CHECK(r.exit_code == 1);
  CHECK(r.limit == SandboxLimit::none);
  CHECK(r.stderr_text.find("No space left on device") != std::string::npos);
}

void check_print_1g(const SandboxResult& r) {
  CHECK(r.limit == SandboxLimit::output_size);
  CHECK(r.stdout_truncated);
  CHECK(r.stdout_text.size() == drill_limits().max_output_bytes);
  CHECK(r.describe(drill_limits()) == "killed: output over the limit of 65536 bytes");
}

void check_sleep(const SandboxResult& r) {
  CHECK(r.timed_out);
  CHECK(r.limit == SandboxLimit::wall_time);
  CHECK(r.wall_seconds >= drill_limits().wall_seconds);
  CHECK(r.wall_seconds < drill_limits().wall_seconds + 2.0);
  CHECK(r.describe(drill_limits()) == "killed: wall-time limit of 4 s");
}

void check_spin(const SandboxResult& r) {
  INFO(r.describe(spin_limits()));
  CHECK(r.limit == SandboxLimit::cpu_time);
  CHECK(r.signal == SIGXCPU);
  CHECK(r.describe(spin_limits()) == "killed: CPU-time limit of 1 s");
  CHECK_FALSE(r.timed_out);
}

void check_allocate(const SandboxResult& r) {
  INFO(r.stdout_text << r.stderr_text);
  CHECK(r.exit_code == 1);
  CHECK(r.stdout_text.find("ALLOCATED") == std::string::npos);
  CHECK(r.stderr_text.find("MemoryError") != std::string::npos);
}

struct Drill {
  std::string name;
  std::string code;
  std::vector<std::string> args;
  std::function<void(const SandboxResult&)> check;
  SandboxLimits limits = drill_limits();
};

std::vector<Drill> drills(int host_port) {
  const char* home = std::getenv("HOME");  // NOLINT(concurrency-mt-unsafe)
  return {
      {"read", kReadOutside, {"/etc/shadow", home ? home : "/root", "/root", HYFLOW_SOURCE_DIR}, check_read_outside},
      {"socket", kSocket, {std::to_string(host_port)}, check_socket},
      {"forkbomb", kForkBomb, {}, check_fork_bomb},
      {"filldisk", kFillDisk, {}, check_fill_disk},
      {"print1g", kPrint1G, {}, check_print_1g},
      {"sleep", kSleep, {}, check_sleep},
      // One CPU second, with wall time to spare on a loaded machine.
      {"spin", kSpin, {}, check_spin, spin_limits()},
      {"allocate", kAllocate, {}, check_allocate},
  };
}

SandboxResult run_drill(const Sandbox& sandbox, const Drill& drill) {
  SandboxCommand command{.argv = {"/usr/bin/python3", "-I", "main.py", marker_for(drill.name)},
                         .files = {{.name = "main.py", .content = drill.code}}};
  command.argv.insert(command.argv.end(), drill.args.begin(), drill.args.end());
  return sandbox.run(command, drill.limits);
}

}  // namespace

TEST_CASE("the sandbox runs Python: stdout, stderr, exit status, stdin, files, environment", "[agents][sandbox]") {
  auto sandbox = sandbox_or_skip();
  if (!sandbox) return;
  auto r = sandbox->run_python("import sys\nprint(6 * 7)\nprint('oops', file=sys.stderr)\n", drill_limits());
  CHECK(r.ok());
  CHECK(r.stdout_text == "42\n");
  CHECK(r.stderr_text == "oops\n");
  CHECK(r.describe(drill_limits()) == "exit status 0");

  r = sandbox->run_python("import sys\nprint(sys.stdin.read().upper())\nsys.exit(3)\n", drill_limits(), "hello");
  CHECK(r.exit_code == 3);
  CHECK(r.stdout_text == "HELLO\n");
  CHECK_FALSE(r.ok());

  SandboxCommand command{.argv = {"/usr/bin/python3", "-c",
                                  "import os; print(open('data.txt').read(), os.getcwd(), os.environ['ANSWER'])"},
                         .files = {{.name = "data.txt", .content = "payload"}},
                         .env = {{"ANSWER", "42"}}};
  r = sandbox->run(command, drill_limits());
  CHECK(r.stdout_text == "payload /tmp 42\n");

  r = sandbox->run_python("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", drill_limits());
  CHECK(r.signal == SIGTERM);
  CHECK(r.exit_code == -1);
  CHECK(r.describe(drill_limits()) == "killed by signal 15 (SIGTERM)");

  // Nothing of the host: the environment is clean and the host's /tmp is not the sandbox's.
  r = sandbox->run_python("import os\nprint(sorted(os.environ))\nprint(os.listdir('/tmp'))\n", drill_limits());
  CHECK(r.stdout_text == "['HOME', 'LANG', 'PATH', 'PWD']\n['main.py']\n");
}

TEST_CASE("the sandbox names what is wrong with a command and a missing bwrap", "[agents][sandbox]") {
  CHECK_THROWS_AS(Sandbox({.bwrap = "no-such-bwrap-hyflow"}), SandboxUnavailable);
  CHECK_THROWS_WITH(Sandbox({.bwrap = "no-such-bwrap-hyflow"}), Catch::Contains("bubblewrap"));
  auto sandbox = sandbox_or_skip();
  if (!sandbox) return;
  CHECK_THROWS_AS(sandbox->run({}, drill_limits()), ValueError);
  CHECK_THROWS_WITH(sandbox->run({.argv = {"/usr/bin/true"}, .files = {{.name = "../x"}}}, drill_limits()),
                    Catch::Contains("'../x'"));
  SandboxLimits zero = drill_limits();
  zero.wall_seconds = 0;
  CHECK_THROWS_AS(sandbox->run({.argv = {"/usr/bin/true"}}, zero), ValueError);
}

TEST_CASE("the drill: each escape is stopped, says why and leaves no process behind", "[agents][sandbox][drill]") {
  auto sandbox = sandbox_or_skip();
  if (!sandbox) return;
  HostListener listener;
  for (const auto& drill : drills(listener.port)) {
    SECTION(drill.name) {
      auto r = run_drill(*sandbox, drill);
      drill.check(r);
      CHECK(processes_with(marker_for(drill.name)) == 0);
    }
  }
}

TEST_CASE("the drill all at once, next to an honest program, from many threads", "[agents][sandbox][drill]") {
  auto sandbox = sandbox_or_skip();
  if (!sandbox) return;
  HostListener listener;
  auto all = drills(listener.port);
  std::vector<std::future<SandboxResult>> running;
  for (const auto& drill : all)
    running.push_back(std::async(std::launch::async, [&] { return run_drill(*sandbox, drill); }));
  auto honest =
      std::async(std::launch::async, [&] { return sandbox->run_python("print(2 ** 100)\n", drill_limits()); });
  for (size_t i = 0; i < all.size(); ++i) {
    INFO("drill " << all[i].name);
    all[i].check(running[i].get());
    CHECK(processes_with(marker_for(all[i].name)) == 0);
  }
  auto r = honest.get();
  CHECK(r.ok());
  CHECK(r.stdout_text == "1267650600228229401496703205376\n");
}
