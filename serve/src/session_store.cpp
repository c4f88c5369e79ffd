#include <hyflow/serve/session_store.hpp>

#include <hyflow/serve/api_error.hpp>

#include <hyflow/dataproto/position_ids.hpp>

#include <torch/torch.h>

#include <algorithm>

namespace hyflow::serve {

SessionStore::SessionStore(SessionStoreOptions options) : options_(options) {}

void SessionStore::check_id(const std::string& id) const {
  if (id.size() > options_.max_session_id_bytes) {
    throw bad_request("X-Session-Id", "the session id has " + std::to_string(id.size()) + " bytes, at most " +
                                          std::to_string(options_.max_session_id_bytes) + " are allowed");
  }
  if (std::any_of(id.begin(), id.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    throw bad_request("X-Session-Id", "the session id has control characters");
  }
}

bool SessionStore::record(const std::string& id, Turn turn) {
  std::lock_guard lk(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    if (sessions_.size() >= options_.max_sessions && !order_.empty()) {
      sessions_.erase(order_.front());
      order_.pop_front();
    }
    it = sessions_.emplace(id, Session{.id = id, .turns = {}}).first;
  } else {
    order_.erase(std::find(order_.begin(), order_.end(), id));
  }
  order_.push_back(id);
  if (it->second.turns.size() >= options_.max_turns) return false;
  it->second.turns.push_back(std::move(turn));
  return true;
}

std::optional<Session> SessionStore::get(const std::string& id) const {
  std::lock_guard lk(mu_);
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  return it->second;
}

std::optional<Session> SessionStore::take(const std::string& id) {
  std::lock_guard lk(mu_);
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  Session s = std::move(it->second);
  sessions_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), id));
  return s;
}

std::vector<std::string> SessionStore::ids() const {
  std::lock_guard lk(mu_);
  return {order_.begin(), order_.end()};
}

namespace {

struct Row {
  std::vector<int64_t> prompt, response, context;  // context = prompt + response
  std::vector<float> log_probs;
  std::vector<int64_t> mask;
  std::vector<int64_t> versions;
  std::vector<int64_t> token_versions;  // per response token; -1 where the model did not produce it
};

}  // namespace

DataProto session_to_data_proto(const Session& session, int64_t pad_token_id) {
  if (session.turns.empty()) throw ValueError("session '" + session.id + "' has no turns");
  std::vector<Row> rows;
  for (const auto& turn : session.turns) {
    Row* extended = nullptr;
    for (auto& row : rows) {  // the row with the longest context that prefixes this prompt
      if (row.context.size() <= turn.prompt_ids.size() &&
          std::equal(row.context.begin(), row.context.end(), turn.prompt_ids.begin()) &&
          (extended == nullptr || row.context.size() > extended->context.size())) {
        extended = &row;
      }
    }
    if (extended == nullptr) {
      rows.push_back(Row{.prompt = turn.prompt_ids,
                         .response = {},
                         .context = turn.prompt_ids,
                         .log_probs = {},
                         .mask = {},
                         .versions = {},
                         .token_versions = {}});
      extended = &rows.back();
    }
    auto& row = *extended;
    for (size_t i = row.context.size(); i < turn.prompt_ids.size(); ++i) {  // not the model's tokens
      row.response.push_back(turn.prompt_ids[i]);
      row.log_probs.push_back(0.0F);
      row.mask.push_back(0);
      row.token_versions.push_back(-1);
    }
    for (size_t i = 0; i < turn.completion_ids.size(); ++i) {
      row.response.push_back(turn.completion_ids[i]);
      row.log_probs.push_back(i < turn.completion_log_probs.size() ? turn.completion_log_probs[i] : 0.0F);
      row.mask.push_back(1);
      const auto& per_token = turn.completion_weight_versions;
      row.token_versions.push_back(i < per_token.size() ? per_token[i] : turn.weight_version);
    }
    row.context = turn.prompt_ids;
    row.context.insert(row.context.end(), turn.completion_ids.begin(), turn.completion_ids.end());
    row.versions.push_back(turn.weight_version);
  }
  const auto B = static_cast<int64_t>(rows.size());
  int64_t P = 0, R = 0;
  for (const auto& row : rows) {
    P = std::max<int64_t>(P, static_cast<int64_t>(row.prompt.size()));
    R = std::max<int64_t>(R, static_cast<int64_t>(row.response.size()));
  }
  auto prompts = torch::full({B, P}, pad_token_id, torch::kLong);
  auto responses = torch::full({B, R}, pad_token_id, torch::kLong);
  auto response_mask = torch::zeros({B, R}, torch::kLong);
  auto log_probs = torch::zeros({B, R}, torch::kFloat);
  auto token_versions = torch::full({B, R}, -1, torch::kLong);
  auto attention_mask = torch::zeros({B, P + R}, torch::kLong);
  dataproto::Column session_ids, versions;
  for (int64_t b = 0; b < B; ++b) {
    const auto& row = rows[static_cast<size_t>(b)];
    const auto p = static_cast<int64_t>(row.prompt.size());
    const auto r = static_cast<int64_t>(row.response.size());
    prompts[b].slice(0, P - p, P).copy_(torch::tensor(row.prompt, torch::kLong));
    attention_mask[b].slice(0, P - p, P + r).fill_(1);
    if (r > 0) {
      responses[b].slice(0, 0, r).copy_(torch::tensor(row.response, torch::kLong));
      response_mask[b].slice(0, 0, r).copy_(torch::tensor(row.mask, torch::kLong));
      log_probs[b].slice(0, 0, r).copy_(torch::tensor(row.log_probs, torch::kFloat));
      token_versions[b].slice(0, 0, r).copy_(torch::tensor(row.token_versions, torch::kLong));
    }
    session_ids.push_back(session.id);
    versions.push_back(row.versions);
  }
  auto position_ids = dataproto::position_ids_from_mask(attention_mask);
  TensorDict batch{{"prompts", prompts},
                   {"responses", responses},
                   {"response_mask", response_mask},
                   {"rollout_log_probs", log_probs},
                   {"input_ids", torch::cat({prompts, responses}, 1)},
                   {"attention_mask", attention_mask},
                   {"position_ids", position_ids},
                   {"rollout_weight_versions", token_versions}};
  dataproto::NonTensorBatch columns;
  columns["session_id"] = std::move(session_ids);
  columns["weight_versions"] = std::move(versions);
  return DataProto(std::move(batch), std::move(columns));
}

}  // namespace hyflow::serve
