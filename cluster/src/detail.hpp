#pragma once
// Internal to the cluster module: the node manager's protocol atoms and the helpers its
// translation units share.

#include <hyflow/cluster/node_info.hpp>
#include <hyflow/cluster/tls.hpp>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>

#include <chrono>
#include <string>
#include <utility>

namespace hyflow::cluster::detail {

using hello_atom = caf::atom_constant<caf::atom("hf_hello")>;
using spawn_atom = caf::atom_constant<caf::atom("hf_spawn")>;
using port_atom = caf::atom_constant<caf::atom("hf_port")>;
/// To a RemoteLauncher's session actor: monitor this node manager (address).
using watch_atom = caf::atom_constant<caf::atom("hf_watch")>;

/// An error of the "hfnode" category carrying `text`.
caf::error node_error(std::string text);
/// The text of an "hfnode" or "hyflow" error's context, else CAF's rendering.
std::string error_text(caf::actor_system& sys, const caf::error& e);

/// "host:port" -> (host, port); ValueError naming the entry.
std::pair<std::string, int> split_address(const std::string& addr);
/// This machine: host name, CPUs, GPUs (names and memory with HYFLOW_CUDA).
NodeInfo local_node_info();

/// Loads CAF's openssl module into `cfg` with `files` (already checked); after the middleman.
void configure_tls(caf::actor_system_config& cfg, const TlsFiles& files);

/// Shutdown ordering (shutdown.cpp). The controller's guard: a non-hidden actor that, once
/// sent guard_gone_atom, keeps ~actor_system from stopping the middleman until the BASP broker
/// has handled the down messages of the actors that ended.
using guard_gone_atom = caf::atom_constant<caf::atom("hf_gone")>;
caf::actor spawn_shutdown_guard(caf::actor_system& sys);
/// The node's form, blocking (after await_all_actors_done): waits up to `budget`.
void drain_basp(caf::actor_system& sys, std::chrono::milliseconds budget);

}  // namespace hyflow::cluster::detail
