#pragma once
// Liveness of the other ranks of a process group, for the survivors of a dead or hung peer.
// A rank waiting inside a gloo collective for a peer whose process was killed or stopped
// (SIGSTOP, a hung node) waits until gloo's own timeout (30 s by default) and then blames the
// wrong rank. PeerLiveness lets the waiter give up as soon as a peer is known to be gone:
// every rank beats (a counter in the group's store) from a thread of its own, and reads the
// others' counters. Needs neither torch nor CUDA.

#include <hyflow/parallel/watchdog.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::parallel {

/// Beats for one rank and watches the other ranks' beats through a KeyValueStore
/// ("<group>/alive/<rank>"). A peer counts as gone when its counter has not moved for
/// `timeout` worth of this rank's own beats (so a process that is itself starved of CPU does
/// not accuse its peers), or when every store operation failed for `timeout` (the store lives
/// in rank 0's process). The verdict is sticky; `on_failure` runs once, on the beating thread.
class PeerLiveness {
 public:
  struct Options {
    std::string group = "default";
    int rank = 0;
    int world_size = 1;
    std::chrono::milliseconds interval{250};
    std::chrono::milliseconds timeout{5000};
    /// Where the store lives, for messages ("127.0.0.1:29500").
    std::string store_address;
    /// Each rank's node ("host:port"; empty or "" entries: unknown), so that a verdict names the
    /// silent rank's node and the other ranks on it.
    std::vector<std::string> nodes;
  };
  /// `store` is this rank's own connection (its operations must time out on their own, well
  /// within `timeout`); the thread starts at once.
  PeerLiveness(Options options, std::unique_ptr<KeyValueStore> store,
               std::function<void(const std::string&)> on_failure = {});
  ~PeerLiveness();
  PeerLiveness(const PeerLiveness&) = delete;
  PeerLiveness& operator=(const PeerLiveness&) = delete;

  /// Why the group cannot go on (which rank stopped beating, or the unreachable store), once known.
  std::optional<std::string> failure() const;
  /// Stops beating at once (the destructor does it too): the peers will see this rank as gone.
  void stop();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace hyflow::parallel
