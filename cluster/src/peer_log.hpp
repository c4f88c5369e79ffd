#pragma once
// Internal to the cluster module: log lines about what peers did (a wrong secret, another
// protocol version, a handshake evicted or timed out) at a bounded rate. A flood of 9,200
// wrong-secret attempts a second used to write one 88-byte line each (0.8 MB/s of log); now the
// first event of a kind from an address in each window is logged in full and the rest are
// counted, then summarized: "front door: 9199 more failed authentications from 10.0.0.7 in the
// last 10 s". Not thread-safe: one owner (the front door's thread) calls it.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace hyflow::cluster::detail {

class PeerLog {
 public:
  using Clock = std::chrono::steady_clock;

  /// `prefix` starts every line ("front door"); at most `max_addresses` addresses are told
  /// apart in a window, the others are summarized together as "other addresses".
  PeerLog(std::string prefix, std::chrono::milliseconds window, size_t max_addresses = 64);

  /// One event of `kind` (a plural for the summary, e.g. "failed authentications") from
  /// `address`. The first of its kind and address in the window logs `line()` (called only
  /// then); the others are counted.
  void note(const std::string& kind, const std::string& address, const std::function<std::string()>& line);

  /// Ends the window once it has lasted `window`, logging one summary per kind and address
  /// that had more than its first event. Returns when it needs calling next (max() when idle).
  Clock::time_point flush(Clock::time_point now);

  /// Logs every open count now (at shutdown), whatever the window's age.
  void flush_all();

 private:
  void summarize(Clock::time_point now);

  std::string prefix_;
  std::chrono::milliseconds window_;
  size_t max_addresses_;
  Clock::time_point started_{};
  bool open_ = false;
  std::map<std::pair<std::string, std::string>, uint64_t> more_;  ///< (kind, address) -> events after the first
  std::set<std::string> addresses_;                               ///< addresses told apart this window
};

}  // namespace hyflow::cluster::detail
