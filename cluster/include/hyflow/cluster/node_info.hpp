#pragma once
// What a caf-node is and says about itself, the cluster's error type and its log line.

#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/data_proto.hpp>  // hyflow::Json

#include <cstdint>
#include <string>
#include <vector>

namespace hyflow::cluster {

/// Version of the controller <-> node protocol; a mismatch is a ClusterError on connect.
/// v2: plain nodes authenticate at a front door before CAF (cluster/src/front_door.hpp).
inline constexpr uint32_t kNodeProtocolVersion = 2;

/// Connecting to, authenticating with or placing workers on a node failed. what() names the
/// node ("host:port") and the cause.
class ClusterError : public Error {
 public:
  using Error::Error;
};

/// What a node advertises.
struct NodeInfo {
  std::string address;  ///< "host:port" as the controller reached it
  std::string hostname;
  int cpus = 0;
  int gpus = 0;
  std::vector<std::string> gpu_names;
  std::vector<int64_t> gpu_memory_bytes;
  uint32_t protocol_version = 0;

  Json to_json() const;
  static NodeInfo from_json(const Json& j);
};

/// "host:port,host:port" (the cluster.nodes key) -> addresses; ValueError naming a bad entry.
std::vector<std::string> parse_node_list(const std::string& list);

/// One log line to stderr: "2026-11-22T07:10:00.123Z [caf-node] text".
void cluster_log(const std::string& text);

}  // namespace hyflow::cluster
