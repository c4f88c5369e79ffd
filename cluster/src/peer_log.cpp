// Rate-limited log lines about peers (peer_log.hpp).
#include "peer_log.hpp"

#include <hyflow/cluster/node_info.hpp>

#include <cstdio>

namespace hyflow::cluster::detail {

PeerLog::PeerLog(std::string prefix, std::chrono::milliseconds window, size_t max_addresses)
    : prefix_(std::move(prefix)), window_(window), max_addresses_(max_addresses) {}

void PeerLog::note(const std::string& kind, const std::string& address, const std::function<std::string()>& line) {
  const auto now = Clock::now();
  flush(now);
  if (!open_) {
    open_ = true;
    started_ = now;
  }
  std::string who = address;
  if (!addresses_.count(who)) {
    if (addresses_.size() >= max_addresses_) who = "other addresses";
    addresses_.insert(who);
  }
  auto [it, first] = more_.try_emplace({kind, who}, 0);
  if (first && who == address) cluster_log(prefix_ + ": " + line());
  else ++it->second;
}

PeerLog::Clock::time_point PeerLog::flush(Clock::time_point now) {
  if (!open_) return Clock::time_point::max();
  if (now - started_ < window_) return started_ + window_;
  summarize(now);
  return Clock::time_point::max();
}

void PeerLog::flush_all() {
  if (open_) summarize(Clock::now());
}

void PeerLog::summarize(Clock::time_point now) {
  char span[32];
  std::snprintf(span, sizeof span, "%.1f s", std::chrono::duration<double>(now - started_).count());
  for (const auto& [key, count] : more_) {
    if (count == 0) continue;
    const bool others = key.second == "other addresses";
    cluster_log(prefix_ + ": " + std::to_string(count) + (others ? " " : " more ") + key.first + " from " +
                key.second + " in the last " + span);
  }
  more_.clear();
  addresses_.clear();
  open_ = false;
}

}  // namespace hyflow::cluster::detail
