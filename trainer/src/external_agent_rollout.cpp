// A training step's rollout by a black-box agent: the prompts out as JSON rows, the program run
// against the router with every rank open to it, the sessions collected from the ranks into the
// training rows.
#include "external_agent_rollout.hpp"

#include <hyflow/agents/external_agent.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/workers/actor_rollout_ref_worker.hpp>

#include <torch/torch.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>

namespace hyflow::trainer {
namespace {

namespace fs = std::filesystem;
using workers::ActorRolloutRefWorker;

std::string random_run_id() {
  std::random_device rd;
  std::ostringstream out;
  out << std::hex << rd() << rd();
  return out.str();
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

/// The program's row for prompt `i`: "messages" (the raw prompt as a user turn, or the raw chat
/// itself), "ground_truth" and the prompt's non-tensor columns.
nlohmann::json program_row(const DataProto& prompts, size_t i) {
  nlohmann::json row = nlohmann::json::object();
  for (const auto& key : prompts.non_tensor_batch.keys()) row[key] = prompts.non_tensor_batch.at(key).at(i);
  if (row.contains("raw_prompt")) {
    const auto& raw = row.at("raw_prompt");
    row["messages"] = raw.is_array() ? raw : nlohmann::json::array({{{"role", "user"}, {"content", raw}}});
  }
  if (row.contains("reward_model") && row.at("reward_model").is_object() &&
      row.at("reward_model").contains("ground_truth"))
    row["ground_truth"] = row.at("reward_model").at("ground_truth");
  return row;
}

std::vector<int64_t> row_values(const at::Tensor& t) {
  const auto c = t.to(torch::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

/// {run folder}/trajectories.jsonl: each training row as collected (unpadded prompt and response
/// ids, response_mask, rollout_log_probs), what the trainer trains on, for inspection.
void write_trajectories(const std::string& path, const DataProto& batch) {
  std::ofstream out(path);
  const auto& b = batch.batch;
  const int64_t P = b.at("prompts").size(1);
  for (int64_t r = 0; r < batch.size(); ++r) {
    const auto attention = b.at("attention_mask")[r].to(torch::kBool);
    const auto prompt_len = attention.slice(0, 0, P).sum().item<int64_t>();
    const auto response_len = attention.slice(0, P).sum().item<int64_t>();
    const auto lp = b.at("rollout_log_probs")[r].slice(0, 0, response_len).to(torch::kDouble).contiguous();
    nlohmann::json row{
        {"session_id", batch.non_tensor_batch.at("session_id").at(static_cast<size_t>(r))},
        {"row_index", batch.non_tensor_batch.at("row_index").at(static_cast<size_t>(r))},
        {"prompt_ids", row_values(b.at("prompts")[r].slice(0, P - prompt_len))},
        {"response_ids", row_values(b.at("responses")[r].slice(0, 0, response_len))},
        {"response_mask", row_values(b.at("response_mask")[r].slice(0, 0, response_len))},
        {"rollout_log_probs", std::vector<double>(lp.data_ptr<double>(), lp.data_ptr<double>() + lp.numel())}};
    out << row.dump() << '\n';
  }
  if (!out) throw Error("black-box agent: cannot write '" + path + "'");
}

/// Model turns of a row: the runs of response_mask 1.
int64_t model_turns(const at::Tensor& mask_row) {
  const auto m = row_values(mask_row);
  int64_t runs = 0;
  for (size_t t = 0; t < m.size(); ++t)
    if (m[t] != 0 && (t == 0 || m[t - 1] == 0)) ++runs;
  return runs;
}

}  // namespace

ExternalAgentRollout::ExternalAgentRollout(agents::ExternalAgentConfig config, std::string api_key,
                                           std::string local_dir, int64_t pad_token_id, int64_t world)
    : config_(std::move(config)),
      api_key_(std::move(api_key)),
      local_dir_(std::move(local_dir)),
      run_id_(random_run_id()),
      pad_token_id_(pad_token_id),
      world_(world) {}

DataProto ExternalAgentRollout::generate(WorkerGroup& rollout, const std::string& base_url, const DataProto& prompts,
                                         int64_t n, const std::string& uid_prefix, nlohmann::json& m) {
  const std::string batch_name = uid_prefix.substr(0, uid_prefix.find_last_not_of('-') + 1);  // "s3", "s3-g1"
  const auto B = static_cast<size_t>(prompts.size());
  std::vector<nlohmann::json> rows;
  std::vector<std::string> ids;
  std::map<std::string, size_t> index_of;  // session id -> prompt * n + sample
  for (size_t i = 0; i < B; ++i) {
    const nlohmann::json base = program_row(prompts, i);
    for (int64_t s = 0; s < n; ++s) {
      nlohmann::json row = base;
      row["sample"] = s;
      rows.push_back(std::move(row));
      ids.push_back(run_id_ + "-" + uid_prefix + "p" + std::to_string(i) + "-" + std::to_string(s));
      index_of[ids.back()] = ids.size() - 1;
    }
  }
  agents::ExternalAgentOptions options{.command = config_.command,
                                       .timeout_seconds = config_.timeout,
                                       .api_key = api_key_,
                                       .pad_token_id = pad_token_id_,
                                       .keep_files = config_.keep_files};
  if (config_.keep_files) {
    options.work_dir = (fs::path(local_dir_) / "external_agent" / batch_name).string();
    fs::create_directories(options.work_dir);
  }

  // every rank serves the router's requests until its sessions are collected, also when the program fails to start
  rollout.call(&ActorRolloutRefWorker::open_agent_server);
  agents::ExternalAgentResult result;
  std::exception_ptr failure;
  try {
    result = agents::run_agent_program(options, base_url, rows, ids);
  } catch (...) {
    failure = std::current_exception();
  }
  const Value collected = rollout.call(&ActorRolloutRefWorker::collect_agent_sessions, ids);
  if (failure) std::rethrow_exception(failure);
  std::vector<DataProto> parts;
  if (collected.is_list())
    for (const auto& part : collected.list())
      if (part.is_dataproto() && part.dataproto().size() > 0) parts.push_back(part.dataproto());

  const std::string agent = "black-box agent '" + command_line(config_.command) + "'";
  std::string ended = result.timed_out ? "was killed after its timeout of " + std::to_string(config_.timeout) + " s"
                      : result.signal  ? "was killed by signal " + std::to_string(result.signal)
                                       : "exited with code " + std::to_string(result.exit_code);
  if (result.timed_out || result.exit_code != 0)
    std::cerr << agent << " in generation batch " << batch_name << " " << ended << "; the end of its log:\n"
              << result.log_tail << std::endl;
  for (const auto& problem : result.problems) std::cerr << agent << ": " << problem << "\n";

  DataProto batch = agents::concat_sessions(parts, pad_token_id_);
  std::set<std::string> found;
  if (batch.size() > 0)
    for (const auto& id : batch.non_tensor_batch.at("session_id")) found.insert(id.get<std::string>());
  const int64_t dropped = batch.size() % world_;  // data-parallel chunks are equal
  if (batch.size() - dropped <= 0)
    throw Error(agent + " recorded no trajectory in generation batch " + batch_name + " (" +
                std::to_string(found.size()) + " of " + std::to_string(ids.size()) + " sessions, " +
                std::to_string(batch.size()) + " row(s) for " + std::to_string(world_) + " training rank(s)); it " +
                ended + "; the end of its log:\n" + result.log_tail);
  if (dropped > 0) batch = batch.slice(0, batch.size() - dropped);

  dataproto::Column row_index, agent_reward, num_turns;
  std::vector<int64_t> prompt_rows;
  const auto& session_ids = batch.non_tensor_batch.at("session_id");
  const auto& masks = batch.batch.at("response_mask");
  int64_t with_reward = 0;
  for (size_t r = 0; r < static_cast<size_t>(batch.size()); ++r) {
    const auto id = session_ids.at(r).get<std::string>();
    const size_t j = index_of.at(id);
    prompt_rows.push_back(static_cast<int64_t>(j) / n);
    row_index.emplace_back(j);
    const auto reward = result.rewards.find(id);
    const bool given = config_.reward == "agent" && reward != result.rewards.end();
    with_reward += given ? 1 : 0;
    agent_reward.push_back(given ? nlohmann::json(reward->second) : nlohmann::json());
    num_turns.emplace_back(2 * model_turns(masks[static_cast<int64_t>(r)]));
  }
  const DataProto prompt_of_row = prompts.select_idxs(prompt_rows);
  for (const auto& key : prompt_of_row.non_tensor_batch.keys())
    batch.non_tensor_batch[key] = prompt_of_row.non_tensor_batch.at(key);
  batch.non_tensor_batch["row_index"] = std::move(row_index);
  batch.non_tensor_batch["agent_reward"] = std::move(agent_reward);
  batch.non_tensor_batch["__num_turns__"] = std::move(num_turns);
  if (config_.keep_files) write_trajectories(result.run_dir + "/trajectories.jsonl", batch);

  const auto rows_n = static_cast<double>(batch.size());
  const auto model_tokens = masks.sum().item<double>();
  const auto response_tokens =
      batch.batch.at("attention_mask").narrow(1, -masks.size(1), masks.size(1)).sum().item<double>();
  m["agent/external/sessions"] = static_cast<double>(found.size());
  m["agent/external/missing_sessions"] = static_cast<double>(ids.size() - found.size());
  m["agent/external/rows"] = rows_n;
  m["agent/external/rows_dropped"] = static_cast<double>(dropped);
  m["agent/external/timed_out"] = result.timed_out ? 1.0 : 0.0;
  m["agent/external/exit_code"] = static_cast<double>(result.exit_code);
  m["agent/external/wall_s"] = result.wall_seconds;
  m["agent/external/rewards_given"] = static_cast<double>(result.rewards.size());
  m["agent/external/reward_file_problems"] = static_cast<double>(result.problems.size());
  m["agent/external/rows_with_agent_reward"] = static_cast<double>(with_reward);
  m["agent/masked_token_fraction"] = response_tokens > 0 ? 1.0 - model_tokens / response_tokens : 0.0;
  return batch;
}

void ExternalAgentRollout::apply_agent_rewards(const DataProto& batch, at::Tensor& reward_tensor,
                                               nlohmann::json& m) const {
  const auto it = batch.non_tensor_batch.find("agent_reward");
  if (it == batch.non_tensor_batch.end()) return;
  const int64_t T = batch.batch.at("responses").size(1);
  const auto valid = batch.batch.at("attention_mask").narrow(1, -T, T).sum(-1);
  int64_t given = 0;
  for (int64_t r = 0; r < batch.size(); ++r) {
    const auto& reward = it->second.at(static_cast<size_t>(r));
    if (!reward.is_number()) continue;
    ++given;
    const int64_t len = valid[r].item<int64_t>();
    reward_tensor[r].zero_();
    reward_tensor[r][len > 0 ? len - 1 : T - 1] = reward.get<double>();
  }
  m["agent/external/agent_reward_fraction"] = batch.size() > 0 ? static_cast<double>(given) / batch.size() : 0.0;
}

}  // namespace hyflow::trainer
