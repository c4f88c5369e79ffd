// The caf-node's Prometheus series, collected at scrape time.
#include <hyflow/actors/worker_stats.hpp>
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/cluster/node_metrics.hpp>
#include <hyflow/metrics/process_metrics.hpp>

namespace hyflow::cluster {

namespace {

void collect_workers(metrics::CollectorSink& out) {
  const auto& w = actors::worker_stats();
  out.gauge("hyflow_node_workers_alive", "Worker actors hosted by this node that have not ended.", {},
            static_cast<double>(w.alive.load(std::memory_order_relaxed)));
  out.gauge("hyflow_node_calls_in_flight", "Worker method calls running now.", {},
            static_cast<double>(w.calls_in_flight.load(std::memory_order_relaxed)));
  const char* help = "Worker method calls answered, by outcome (ok: a result; error: the method threw).";
  out.counter("hyflow_node_calls_total", help, {{"outcome", "ok"}},
              static_cast<double>(w.calls_ok.load(std::memory_order_relaxed)));
  out.counter("hyflow_node_calls_total", help, {{"outcome", "error"}},
              static_cast<double>(w.calls_failed.load(std::memory_order_relaxed)));
}

void collect_data_plane(metrics::CollectorSink& out, uint64_t& bad_tokens) {
  out.counter("hyflow_node_data_plane_received_bytes_total",
              "Payload bytes this node fetched from other processes' data planes.", {},
              static_cast<double>(DataPlane::fetched_bytes()));
  const auto stats = DataPlane::process_stats();
  out.counter("hyflow_node_data_plane_sent_bytes_total", "Payload bytes this node's data plane served to peers.", {},
              stats ? static_cast<double>(stats->bytes_served) : 0.0);
  bad_tokens = stats ? stats->bad_token : 0;
}

}  // namespace

void add_node_metrics(metrics::Registry& registry, const NodeServer& node, std::chrono::milliseconds peer_timeout) {
  metrics::add_process_collector(registry);
  registry.add_collector([&node, peer_timeout](metrics::CollectorSink& out) {
    collect_workers(out);
    uint64_t bad_tokens = 0;
    collect_data_plane(out, bad_tokens);
    const char* auth =
        "Requests refused for a wrong credential, by plane (front_door: the shared secret; "
        "data_plane: the data plane token).";
    out.counter("hyflow_node_auth_failures_total", auth, {{"plane", "front_door"}},
                static_cast<double>(node.wrong_secret_count()));
    out.counter("hyflow_node_auth_failures_total", auth, {{"plane", "data_plane"}}, static_cast<double>(bad_tokens));
    for (const auto& p : node.peer_liveness(peer_timeout))
      out.gauge("hyflow_node_peer_heartbeat_age_seconds",
                "Seconds since the last message (BASP heartbeats included) from a connected peer.", {{"peer", p.peer}},
                p.seconds_since_last_message);
  });
}

}  // namespace hyflow::cluster
