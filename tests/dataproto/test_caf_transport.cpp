// DataProto inside CAF messages: zero copies between actors of one process, the versioned
// wire format between two processes over 127.0.0.1.
#include <hyflow/dataproto/caf_inspect.hpp>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

extern char** environ;

using echo_atom = caf::atom_constant<caf::atom("echo")>;
using ptr_atom = caf::atom_constant<caf::atom("ptr")>;
using namespace std::chrono_literals;

namespace {

struct Config : caf::actor_system_config {
  Config() {
    add_message_type<hyflow::DataProto>("hyflow::DataProto");
    load<caf::io::middleman>();
  }
};

hyflow::DataProto batch(int64_t rows, int64_t cols) {
  hyflow::dataproto::NonTensorBatch nt;
  hyflow::dataproto::Column uid;
  for (int64_t i = 0; i < rows; ++i) uid.push_back(std::string("u").append(std::to_string(i)));
  nt["uid"] = uid;
  return hyflow::DataProto(hyflow::TensorDict{{"x", torch::arange(rows * cols, torch::kFloat).reshape({rows, cols})},
                                              {"bf", torch::ones({rows, 3}, torch::kBFloat16)}},
                           nt, hyflow::Json{{"step", 3}});
}

/// The echo_node child process, its stdout (the port) and stdin (closing it ends the child).
struct Child {
  pid_t pid = -1;
  int to_child = -1;
  FILE* from_child = nullptr;

  Child() {
    int in[2], out[2];
    REQUIRE(::pipe(in) == 0);
    REQUIRE(::pipe(out) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    char* argv[] = {const_cast<char*>(HYFLOW_ECHO_NODE), nullptr};
    REQUIRE(posix_spawn(&pid, HYFLOW_ECHO_NODE, &fa, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_child = in[1];
    from_child = ::fdopen(out[0], "r");
  }
  uint16_t read_port() {
    unsigned port = 0;
    REQUIRE(std::fscanf(from_child, "%u", &port) == 1);
    return static_cast<uint16_t>(port);
  }
  ~Child() {
    if (to_child >= 0) ::close(to_child);
    // Bounded wait, then kill: a test never leaves a process behind.
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) {
        if (from_child) std::fclose(from_child);
        return;
      }
      std::this_thread::sleep_for(100ms);
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    if (from_child) std::fclose(from_child);
  }
};

}  // namespace

TEST_CASE("between actors of one process a DataProto travels without copying tensor storage") {
  Config cfg;
  caf::actor_system sys{cfg};
  auto worker = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {
        [](ptr_atom, const hyflow::DataProto& d) {
          return static_cast<int64_t>(reinterpret_cast<intptr_t>(d.batch.at("x").data_ptr()));
        },
        [](echo_atom, hyflow::DataProto& d) { return d; },
    };
  });
  auto d = batch(256, 4096);
  const auto sent = static_cast<int64_t>(reinterpret_cast<intptr_t>(d.batch.at("x").data_ptr()));
  caf::scoped_actor self{sys};
  self->request(worker, 5s, ptr_atom::value, d)
      .receive([&](int64_t seen) { CHECK(seen == sent); },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  self->request(worker, 5s, echo_atom::value, d)
      .receive([&](const hyflow::DataProto& back) {
                 CHECK(reinterpret_cast<intptr_t>(back.batch.at("x").data_ptr()) == sent);
               },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
}

TEST_CASE("a DataProto crosses to another process over 127.0.0.1 and back") {
  Child child;
  const uint16_t port = child.read_port();
  Config cfg;
  caf::actor_system sys{cfg};
  auto remote = sys.middleman().remote_actor("127.0.0.1", port);
  REQUIRE(remote);
  caf::scoped_actor self{sys};
  auto d = batch(64, 1000);
  self->request(*remote, 10s, echo_atom::value, d)
      .receive(
          [&](const hyflow::DataProto& back) {
            CHECK(back.size() == 64);
            CHECK(torch::equal(back.batch.at("x"), d.batch.at("x")));
            CHECK(torch::equal(back.batch.at("doubled"), d.batch.at("x") * 2));
            CHECK(back.batch.at("bf").scalar_type() == torch::kBFloat16);
            CHECK(back.non_tensor_batch.at("uid") == d.non_tensor_batch.at("uid"));
            CHECK(back.meta_info["step"] == 3);
            CHECK(back.meta_info["echoed_by"] == static_cast<int64_t>(child.pid));
          },
          [&](caf::error& e) { FAIL("remote echo failed: " << sys.render(e)); });
}
