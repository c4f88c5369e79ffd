#pragma once
// The Prometheus series of a caf-node (docs/metrics.md, "caf-node"): hyflow_node_* for its
// workers, calls, data plane bytes, peers' heartbeat ages and authentication failures, plus
// the process_* series of hyflow/metrics/process_metrics.hpp. All are read at scrape time from
// counters the node keeps anyway (atomics, the data plane's and the front door's stats).

#include <hyflow/cluster/node_server.hpp>
#include <hyflow/metrics/registry.hpp>

#include <chrono>

namespace hyflow::cluster {

/// Adds the node's collectors to `registry`. `node` must outlive every later scrape (stop the
/// metrics server before the node). `peer_timeout` bounds the wait for the I/O thread that
/// knows the heartbeat ages (on a timeout the scrape leaves those series out).
void add_node_metrics(metrics::Registry& registry, const NodeServer& node,
                      std::chrono::milliseconds peer_timeout = std::chrono::milliseconds(500));

}  // namespace hyflow::cluster
