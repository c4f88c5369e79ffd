// The black-box agent runner: prompts file out, the program in its own process group, a bounded
// wait, then each session's recorded turns as rollout rows with the agent's reward.
#include <hyflow/agents/external_agent.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/position_ids.hpp>

#include <torch/torch.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "spawn_attr.hpp"

extern char** environ;

namespace hyflow::agents {
namespace {

using Clock = std::chrono::steady_clock;

std::string make_run_dir(const std::string& parent) {
  std::string base = parent;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe)
    base = tmp && *tmp ? tmp : "/tmp";
  }
  std::string pattern = base + "/hyflow-agent-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr)
    throw Error("external agent: cannot make a run folder under '" + base + "': " + std::strerror(errno));
  return pattern;
}

/// The caller's environment with `overrides` replacing or adding variables.
std::vector<std::string> agent_environment(const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::set<std::string> replaced;
  for (const auto& [key, value] : overrides) replaced.insert(key);
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    if (!replaced.count(entry.substr(0, entry.find('=')))) env.push_back(std::move(entry));
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

std::string file_tail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  const auto size = static_cast<size_t>(in.tellg());
  const size_t from = size > bytes ? size - bytes : 0;
  in.seekg(static_cast<std::streamoff>(from));
  std::string text(size - from, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  return text;
}

/// {"session_id": ..., "reward": number} lines; what is not understood goes to `problems`.
void read_rewards(const std::string& path, const std::set<std::string>& ids, ExternalAgentResult& result) {
  std::ifstream in(path);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "rewards file line " + std::to_string(number) + ": ";
    auto row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object() || !row.contains("session_id") || !row["session_id"].is_string() || !row.contains("reward") ||
        !row["reward"].is_number()) {
      result.problems.push_back(where + "expected {\"session_id\": <string>, \"reward\": <number>}");
      continue;
    }
    const auto id = row["session_id"].get<std::string>();
    if (!ids.count(id)) {
      result.problems.push_back(where + "unknown session id '" + id + "'");
      continue;
    }
    result.rewards[id] = row["reward"].get<double>();
  }
}

}  // namespace

DataProto concat_sessions(const std::vector<DataProto>& parts, int64_t pad_token_id) {
  if (parts.empty()) return {};
  int64_t P = 0, R = 0;
  for (const auto& part : parts) {
    P = std::max(P, part.batch["prompts"].size(1));
    R = std::max(R, part.batch["responses"].size(1));
  }
  std::vector<at::Tensor> prompts, responses, masks, log_probs, attention;
  dataproto::NonTensorBatch columns;
  for (const auto& part : parts) {
    const int64_t p = part.batch["prompts"].size(1), r = part.batch["responses"].size(1);
    // prompts (B, p) -> (B, P) on the left; responses (B, r) -> (B, R) on the right
    prompts.push_back(torch::constant_pad_nd(part.batch["prompts"], {P - p, 0}, pad_token_id));
    responses.push_back(torch::constant_pad_nd(part.batch["responses"], {0, R - r}, pad_token_id));
    masks.push_back(torch::constant_pad_nd(part.batch["response_mask"], {0, R - r}, 0));
    log_probs.push_back(torch::constant_pad_nd(part.batch["rollout_log_probs"], {0, R - r}, 0));
    attention.push_back(torch::constant_pad_nd(part.batch["attention_mask"], {P - p, R - r}, 0));
    for (const auto& key : part.non_tensor_batch.keys()) {
      auto& column = columns[key];
      const auto& values = part.non_tensor_batch.at(key);
      column.insert(column.end(), values.begin(), values.end());
    }
  }
  auto prompt_ids = torch::cat(prompts), response_ids = torch::cat(responses);
  auto attention_mask = torch::cat(attention);
  TensorDict batch{{"prompts", prompt_ids},
                   {"responses", response_ids},
                   {"response_mask", torch::cat(masks)},
                   {"rollout_log_probs", torch::cat(log_probs)},
                   {"input_ids", torch::cat({prompt_ids, response_ids}, 1)},
                   {"attention_mask", attention_mask},
                   {"position_ids", dataproto::position_ids_from_mask(attention_mask)}};
  return DataProto(std::move(batch), std::move(columns));
}

namespace {
void check_agent_options(const ExternalAgentOptions& options) {
  if (options.command.empty() || options.command.front().empty())
    throw ValueError("external agent: the command is empty");
  if (!(options.timeout_seconds > 0))
    throw ValueError("external agent: timeout_seconds must be positive, got " +
                     std::to_string(options.timeout_seconds));
}
}  // namespace

ExternalAgentRunner::ExternalAgentRunner(serve::Server& server, ExternalAgentOptions options)
    : server_(server), options_(std::move(options)) {
  check_agent_options(options_);
}

ExternalAgentResult ExternalAgentRunner::run(const std::vector<nlohmann::json>& rows,
                                             const std::vector<std::string>& session_ids) {
  for (const auto& id : session_ids) server_.sessions().check_id(id);
  auto result = run_agent_program(options_, server_.base_url(), rows, session_ids, [&] {
    for (const auto& id : session_ids) (void)server_.sessions().take(id);
  });

  std::vector<DataProto> parts;
  for (size_t i = 0; i < session_ids.size(); ++i) {
    const auto& id = session_ids[i];
    auto session = server_.sessions().take(id);
    if (!session || session->turns.empty()) {
      result.missing_sessions.push_back(id);
      continue;
    }
    DataProto part = serve::session_to_data_proto(*session, options_.pad_token_id);
    auto reward = result.rewards.find(id);
    const nlohmann::json agent_reward =
        reward == result.rewards.end() ? nlohmann::json() : nlohmann::json(reward->second);
    part.non_tensor_batch["row_index"] = dataproto::Column(static_cast<size_t>(part.size()), nlohmann::json(i));
    part.non_tensor_batch["agent_reward"] = dataproto::Column(static_cast<size_t>(part.size()), agent_reward);
    parts.push_back(std::move(part));
    result.sessions.push_back(std::move(*session));
  }
  result.batch = concat_sessions(parts, options_.pad_token_id);
  return result;
}

ExternalAgentResult run_agent_program(const ExternalAgentOptions& options, const std::string& base_url,
                                      const std::vector<nlohmann::json>& rows,
                                      const std::vector<std::string>& session_ids,
                                      const std::function<void()>& before_start) {
  check_agent_options(options);
  if (rows.size() != session_ids.size())
    throw ValueError("external agent: " + std::to_string(rows.size()) + " rows but " +
                     std::to_string(session_ids.size()) + " session ids");
  std::set<std::string> ids;
  for (const auto& id : session_ids)
    if (id.empty() || !ids.insert(id).second)
      throw ValueError("external agent: session id '" + id + "' is empty or given twice");
  for (size_t i = 0; i < rows.size(); ++i)
    if (!rows[i].is_object()) throw ValueError("external agent: row " + std::to_string(i) + " is not a JSON object");
  if (before_start) before_start();

  ExternalAgentResult result;
  result.run_dir = make_run_dir(options.work_dir);
  const std::string prompts_path = result.run_dir + "/prompts.jsonl";
  const std::string rewards_path = result.run_dir + "/rewards.jsonl";
  const std::string log_path = result.run_dir + "/agent.log";
  {
    std::ofstream prompts(prompts_path);
    for (size_t i = 0; i < rows.size(); ++i) {
      nlohmann::json row = rows[i];
      row["session_id"] = session_ids[i];
      prompts << row.dump() << '\n';
    }
    if (!prompts) throw Error("external agent: cannot write '" + prompts_path + "'");
  }

  std::vector<std::pair<std::string, std::string>> overrides = {
      {"OPENAI_BASE_URL", base_url},
      {"OPENAI_API_KEY", options.api_key.empty() ? std::string("EMPTY") : options.api_key},
      {"HYFLOW_PROMPTS_FILE", prompts_path},
      {"HYFLOW_REWARDS_FILE", rewards_path},
      {"HYFLOW_SESSION_HEADER", "X-Session-Id"}};
  overrides.insert(overrides.end(), options.env.begin(), options.env.end());
  std::vector<std::string> env = agent_environment(overrides);
  std::vector<std::string> args = options.command;
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  detail::init_group_spawn_attr(attr);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const auto start = Clock::now();
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    if (!options.keep_files) std::filesystem::remove_all(result.run_dir);
    throw Error("external agent: cannot start '" + args[0] + "': " + std::strerror(rc));
  }

  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_seconds));
  int status = 0;
  while (true) {
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) throw Error("external agent: waitpid failed: " + std::string(std::strerror(errno)));
    if (Clock::now() >= deadline) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(-pid, SIGKILL);  // whatever the program left running in its group
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (WIFEXITED(status))
    result.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status))
    result.signal = WTERMSIG(status);
  result.log_tail = file_tail(log_path, 4096);
  read_rewards(rewards_path, ids, result);

  if (!options.keep_files) std::filesystem::remove_all(result.run_dir);
  return result;
}

}  // namespace hyflow::agents
