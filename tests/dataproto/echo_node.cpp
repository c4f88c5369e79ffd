// A second process for test_caf_transport: publishes an actor on 127.0.0.1 (port chosen by
// the OS, printed on stdout) that answers a DataProto with a changed copy. It exits when its
// standard input closes (the test is done or died) or after 60 s.
#include <hyflow/dataproto/caf_inspect.hpp>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <poll.h>
#include <unistd.h>

#include <iostream>

using echo_atom = caf::atom_constant<caf::atom("echo")>;

int main() {
  caf::actor_system_config cfg;
  cfg.add_message_type<hyflow::DataProto>("hyflow::DataProto");
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  auto echo = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {
        [](echo_atom, hyflow::DataProto& d) -> hyflow::DataProto {
          d.batch.set("doubled", d.batch.at("x") * 2);
          d.meta_info["echoed_by"] = static_cast<int64_t>(::getpid());
          return d;
        },
    };
  });
  auto port = sys.middleman().publish(echo, 0, "127.0.0.1", true);
  if (!port) {
    std::cerr << "echo_node: publish failed: " << sys.render(port.error()) << std::endl;
    caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
    return 1;
  }
  std::cout << *port << std::endl;
  pollfd in{STDIN_FILENO, POLLIN, 0};
  ::poll(&in, 1, 60'000);  // stdin readable means EOF: the parent is gone or done
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  std::cout.flush();
  ::_exit(0);  // a published actor would keep ~actor_system waiting (CAF 0.17)
}
