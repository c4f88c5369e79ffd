#pragma once
// Black-box agents: an agent program written elsewhere (any language) solves the prompts through
// the rollout server, tagging each prompt's requests with its session id (X-Session-Id); the
// server records every turn token-exactly. The runner writes the prompts file, starts the program
// in its own process group with OPENAI_BASE_URL and OPENAI_API_KEY set, waits for it with a
// timeout (then kills the whole group), and collects each session as verl's rollout rows
// (serve::session_to_data_proto: prompts, responses, response_mask 0 on every token the model did
// not produce, rollout_log_probs) with the agent's reward when its rewards file gives one; rows
// without it are left to the reward function. Guide: docs/agents-tools.md.
//
// The program's contract (its environment):
//   OPENAI_BASE_URL       the server's ".../v1"
//   OPENAI_API_KEY        the server's bearer token ("EMPTY" when it has none)
//   HYFLOW_PROMPTS_FILE   JSON lines, one per prompt: the caller's row plus "session_id"
//   HYFLOW_REWARDS_FILE   where it may write JSON lines {"session_id": ..., "reward": <number>}
//   HYFLOW_SESSION_HEADER "X-Session-Id", the header that tags a request with its session

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/serve/server.hpp>

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::agents {

struct ExternalAgentOptions {
  std::vector<std::string> command;                      ///< argv; argv[0] is looked up in PATH
  double timeout_seconds = 600.0;                        ///< then the program's process group is killed
  std::string api_key;                                   ///< the server's bearer token; empty: none
  int64_t pad_token_id = 0;                              ///< pads the rows of different sessions to one width
  std::vector<std::pair<std::string, std::string>> env;  ///< added to the caller's environment
  std::string work_dir;                                  ///< where the run's folder is made; empty: $TMPDIR, else /tmp
  bool keep_files = false;                               ///< keep the run's folder (prompts, rewards, agent.log)
};

struct ExternalAgentResult {
  /// Every recorded session's rows (session_to_data_proto's tensors, padded to one width) with the
  /// columns session_id, weight_versions, row_index (the prompt's index) and agent_reward (a
  /// number, or null: left to the reward function). Empty when no session was recorded.
  DataProto batch;
  std::vector<serve::Session> sessions;       ///< the recorded turns, as collected
  std::map<std::string, double> rewards;      ///< the agent's rewards by session id
  std::vector<std::string> missing_sessions;  ///< session ids without a recorded turn
  std::vector<std::string> problems;          ///< rewards-file lines that were not understood
  bool timed_out = false;
  int exit_code = -1;  ///< -1 when it ended by a signal
  int signal = 0;
  double wall_seconds = 0.0;
  std::string log_tail;  ///< the last 4 KiB of the program's stdout and stderr
  std::string run_dir;   ///< the run's folder (removed unless keep_files)
};

class ExternalAgentRunner {
 public:
  /// ValueError for an empty command or a non-positive timeout. `server` must outlive the runner.
  ExternalAgentRunner(serve::Server& server, ExternalAgentOptions options);

  /// Runs the program once over `rows` (any JSON objects; "messages" is what an agent usually
  /// reads), `session_ids[i]` tagging row i. Sessions already recorded under those ids are
  /// dropped first. ValueError for mismatched sizes, duplicate or invalid ids; hyflow::Error when
  /// the program cannot be started; what the program does is in the result.
  ExternalAgentResult run(const std::vector<nlohmann::json>& rows, const std::vector<std::string>& session_ids);

 private:
  serve::Server& server_;
  ExternalAgentOptions options_;
};

/// Runs the program once against `base_url` (an OpenAI ".../v1": one server, or a router in
/// front of several) over `rows`, `session_ids[i]` tagging row i, and reads its rewards file;
/// collects nothing: the result's batch, sessions and missing_sessions are left to the caller, who
/// takes the sessions from wherever they were recorded (ExternalAgentRunner::run: its server; the
/// trainer: every rollout rank's server). `before_start` runs after the arguments are checked,
/// before the program starts. ValueError for bad options, mismatched sizes, duplicate or empty
/// ids, rows that are not objects; hyflow::Error when the program cannot be started.
ExternalAgentResult run_agent_program(const ExternalAgentOptions& options, const std::string& base_url,
                                      const std::vector<nlohmann::json>& rows,
                                      const std::vector<std::string>& session_ids,
                                      const std::function<void()>& before_start = {});

/// Concatenates session batches of different widths: prompts left-padded, responses right-padded
/// (pad_token_id; response_mask and rollout_log_probs 0), input_ids, attention_mask and
/// position_ids rebuilt. Non-tensor columns are concatenated.
DataProto concat_sessions(const std::vector<DataProto>& parts, int64_t pad_token_id);

}  // namespace hyflow::agents
