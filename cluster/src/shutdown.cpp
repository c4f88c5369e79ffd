// Shutdown ordering of actor systems with remote peers (a CAF 0.17.6 race).
#include "detail.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

namespace hyflow::cluster::detail {
namespace {

// ---- shutdown ordering (a CAF 0.17.6 race) -------------------------------------------------
//
// CAF's BASP broker monitors every local actor that a remote node holds a proxy of: on the
// controller, the collector of each group with remote workers (it sends the calls); on a node,
// each worker. When such an actor terminates it first unregisters from the system (so that
// ~actor_system's await_all_actors_done() can return) and only afterwards sends its down
// message to the broker. If ~actor_system stops the middleman in between, the broker never
// handles that message; the queued message keeps a strong reference to the actor, and a
// detached actor (the collector, the workers) that is never destroyed makes ~actor_system
// wait for its thread forever (await_detached_threads). Seen as an intermittent hang of the
// controller at exit (about 1 run in 6 of the gloo test) and a risk for caf-node on SIGTERM.
//
// The cure is an order, not a retry: before the middleman stops, wait until every local actor
// that is ending has run its attachables, then let the broker handle everything queued so
// far. "Ran its attachables" is observable: the broker put the actor into the registry when
// it first forwarded one of its messages, and the registry's erase hook was attached before
// the broker's monitor (attachables run newest first), so once the registry entry of an
// ending actor is gone, its down message is in the broker's mailbox. One request the broker
// answers (FIFO behind that message) then flushes it.

/// A local actor still in the registry that is ending: terminated, or (not hidden) already
/// unregistered. Cleanup unregisters first (that is what lets the running count reach 0), then
/// marks the actor terminated and runs its attachables, the broker's monitor among them, and
/// the registry's erase hook after it; so while this holds, a down message may still be on its
/// way to the broker. Callers only ask once the running count says no other actor runs.
bool ending_actor_in_registry(caf::actor_system& sys) {
  using caf::abstract_actor;
  const auto last = sys.latest_actor_id();
  for (caf::actor_id id = 1; id <= last; ++id) {
    auto p = sys.registry().get<caf::strong_actor_ptr>(id);
    if (!p || p->node() != sys.node()) continue;
    const auto* a = p->get();
    if (a->getf(abstract_actor::is_terminated_flag) ||
        (!a->getf(abstract_actor::is_hidden_flag) && !a->getf(abstract_actor::is_registered_flag)))
      return true;
  }
  return false;
}

caf::actor basp_broker_of(caf::actor_system& sys) {
  return sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
}

}  // namespace

/// Blocking form (NodeServer teardown, after await_all_actors_done): waits up to `budget` for
/// ending actors to run their attachables, then flushes the broker's mailbox.
void drain_basp(caf::actor_system& sys, std::chrono::milliseconds budget) {
  const auto end = std::chrono::steady_clock::now() + budget;
  while (ending_actor_in_registry(sys) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto left =
      std::max(std::chrono::milliseconds(100),
               std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()));
  caf::scoped_actor self{sys, /*hide=*/true};
  self->request(basp_broker_of(sys), caf::timespan{left}, caf::get_atom::value, sys.node())
      .receive([](caf::node_id&, std::string&, uint16_t) {}, [](caf::error&) {});
}

namespace {

using guard_tick_atom = caf::atom_constant<caf::atom("hf_gtick")>;

/// Live shutdown guards per actor system (one per RemoteLauncher). Never destroyed: a guard
/// of a Runtime that is never torn down (leaked by its owner) still ticks while static
/// destructors run at exit.
struct GuardCounts {
  std::mutex mutex;
  std::map<const caf::actor_system*, size_t> live;
};
GuardCounts& guard_counts() {
  static auto* counts = new GuardCounts;
  return *counts;
}

size_t guards_of(const caf::actor_system& sys) {
  auto& g = guard_counts();
  std::lock_guard lock(g.mutex);
  auto it = g.live.find(&sys);
  return it == g.live.end() ? 0 : it->second;
}

struct guard_state {
  // Not an aggregate: CAF 0.17 constructs a state from the actor pointer when it can, and
  // C++20's parenthesized aggregate initialization would turn that pointer into `gone`.
  guard_state() = default;
  bool gone = false;
  int drain_ticks = 0;
  /// Once its launcher is gone nothing else refers to the guard, and CAF destroys an actor
  /// nobody refers to (exit reason "unreachable"), pending messages or not: it holds itself.
  caf::strong_actor_ptr keep_alive;
  static inline const char* name = "hyflow.cluster_shutdown_guard";
};

/// The controller side of the cure: a non-hidden actor, so ~actor_system's
/// await_all_actors_done() waits for it. Once its launcher is gone and no other actor runs
/// (the groups' collectors have terminated), it waits for their attachables, flushes the
/// broker and quits; only then does the actor system go on to stop the middleman. While
/// other actors run (a launcher dropped mid-run) it just idles.
caf::behavior shutdown_guard(caf::stateful_actor<guard_state>* self) {
  {
    auto& g = guard_counts();
    std::lock_guard lock(g.mutex);
    ++g.live[&self->system()];
  }
  auto finish = [self] {
    {
      auto& g = guard_counts();
      std::lock_guard lock(g.mutex);
      if (--g.live[&self->system()] == 0) g.live.erase(&self->system());
    }
    self->quit();
    self->state.keep_alive = nullptr;
  };
  return {
      [self](guard_gone_atom) {
        if (self->state.gone) return;
        self->state.gone = true;
        self->state.keep_alive = caf::actor_cast<caf::strong_actor_ptr>(self);
        self->send(self, guard_tick_atom::value);
      },
      [self, finish](guard_tick_atom) {
        auto& sys = self->system();
        if (sys.registry().running() > guards_of(sys)) {  // groups (or a launcher dropped mid-run) still running
          self->delayed_send(self, std::chrono::milliseconds(10), guard_tick_atom::value);
          return;
        }
        if (ending_actor_in_registry(sys) && ++self->state.drain_ticks < 400) {  // at most ~2 s
          self->delayed_send(self, std::chrono::milliseconds(5), guard_tick_atom::value);
          return;
        }
        self->request(basp_broker_of(sys), std::chrono::seconds(2), caf::get_atom::value, sys.node())
            .then([finish](caf::node_id&, std::string&, uint16_t) { finish(); }, [finish](caf::error&) { finish(); });
      },
  };
}

}  // namespace

caf::actor spawn_shutdown_guard(caf::actor_system& sys) {
  return sys.spawn(shutdown_guard);
}

}  // namespace hyflow::cluster::detail
