#pragma once
// Trajectory capture: the turns of requests tagged with a session id (X-Session-Id or the `user`
// field), with the exact token ids the engine saw and produced, their log-probs and the weight
// version, so the trainer trains on the sampled ids, never on a re-tokenization of the text.

#include <hyflow/dataproto/data_proto.hpp>

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::serve {

/// One choice of one request.
struct Turn {
  std::vector<int64_t> prompt_ids;      ///< the whole prompt the engine ran
  std::vector<int64_t> completion_ids;  ///< what the model produced (its end token included)
  std::vector<float> completion_log_probs;
  int64_t weight_version = 0;  ///< of the first completion token
  /// Per completion token (they change within a turn that a partial weight update resumed);
  /// empty: every token has weight_version.
  std::vector<int64_t> completion_weight_versions;
};

struct Session {
  std::string id;
  std::vector<Turn> turns;  ///< in the order they finished
};

struct SessionStoreOptions {
  size_t max_sessions = 1024;         ///< beyond: the least recently updated session is dropped
  size_t max_turns = 256;             ///< per session; beyond: further turns are not recorded
  size_t max_session_id_bytes = 128;  ///< longer ids are refused (ApiError 400)
};

/// Sessions by id; every member is thread-safe.
class SessionStore {
 public:
  explicit SessionStore(SessionStoreOptions options = {});
  /// Appends a turn. Returns false when the session already holds max_turns.
  bool record(const std::string& session_id, Turn turn);
  std::optional<Session> get(const std::string& session_id) const;
  /// Returns the session and forgets it.
  std::optional<Session> take(const std::string& session_id);
  std::vector<std::string> ids() const;
  /// ApiError 400 naming X-Session-Id when the id is longer than allowed or has control bytes.
  void check_id(const std::string& session_id) const;

 private:
  SessionStoreOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Session> sessions_;
  std::deque<std::string> order_;  // least recently updated first
};

/// A session as verl's rollout rows. Turns chain into one row while each turn's prompt starts with
/// the row's context (its prompt, responses so far): the first prompt becomes `prompts`, and
/// `responses` holds every completion (response_mask 1, rollout_log_probs the sampled log-probs)
/// with the tokens the model did not produce between them (tool results, the next user turn,
/// template tokens: response_mask 0, log-prob 0). A turn that does not extend any row (a sibling
/// choice of n > 1, a re-rendered history) starts a row of its own. Tensors: prompts (B, P) left-
/// padded, responses, response_mask, rollout_log_probs (B, R) right-padded, input_ids,
/// attention_mask, position_ids (B, P + R), rollout_weight_versions (B, R: the weight version of
/// each model token, -1 elsewhere). Columns: session_id, weight_versions (each row's per-turn
/// versions). ValueError for a session without turns.
DataProto session_to_data_proto(const Session& session, int64_t pad_token_id);

}  // namespace hyflow::serve
