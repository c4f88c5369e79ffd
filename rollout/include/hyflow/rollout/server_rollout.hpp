#pragma once
// The "server" rollout backend (actor_rollout_ref.rollout.name=server): each rank of the rollout
// group serves its model over HTTP (a serve::EngineLoop and a serve::Server, OpenAI's shapes) and
// generate_sequences sends every prompt row to that server as a token-id /v1/completions request,
// all rows at once so they share the engine's batch. The batch it builds is the "hf" backend's
// (same columns, shapes, padding, non-tensor columns and meta_info); greedy rollouts are equal
// token for token. Outside agents can call the same server (its base_url is in stats()), e.g.
// through a serve::Router the trainer starts in front of every rank's server.
// Guide: docs/rollout-server.md ("The server rollout backend").

#include <hyflow/core/config_section.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::rollout {

/// actor_rollout_ref.rollout.server
struct ServerRolloutOptions {
  std::string host = "127.0.0.1";  ///< any other address needs token_file
  int64_t port = 0;                ///< 0: a free port; otherwise rank r listens on port + r
  std::string token_file;          ///< file holding the bearer token (empty: none)
  int64_t max_in_flight = 256;     ///< requests queued or running on one rank's server
  double timeout = 600;            ///< seconds one HTTP request of the rollout may take
  std::string tokenizer_path;      ///< the served model's tokenizer folder (null: actor_rollout_ref.model.path)
  std::string served_model_name = "hyflow";  ///< the model id of /v1/models
  /// The trainer's router in front of every rank's server (serve::Router): its port (0: a free one).
  int64_t router_port = 0;
};

/// The router the trainer starts in front of every rollout rank's server (a serve::Router on the
/// section's host, router_port and token), serving until destroyed.
class RolloutRouter {
 public:
  RolloutRouter(const std::vector<std::string>& replica_urls, const ServerRolloutOptions& options);
  ~RolloutRouter();
  RolloutRouter(const RolloutRouter&) = delete;
  RolloutRouter& operator=(const RolloutRouter&) = delete;
  /// "http://host:port/v1"
  std::string base_url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Reads (and in describe mode declares) the keys of the `server` section.
void read_server_rollout_options(ConfigSection s, ServerRolloutOptions& out);

/// The `server` section of an actor_rollout_ref.rollout JSON object, read with its full key paths.
ServerRolloutOptions server_rollout_options(const nlohmann::json& rollout_config);

}  // namespace hyflow::rollout
