#include "validation.hpp"

#include <hyflow/agents/agent_rollout.hpp>
#include <hyflow/algos/metric_utils.hpp>
#include <hyflow/workers/actor_rollout_ref_worker.hpp>

#include <algorithm>
#include <map>

namespace hyflow::trainer {

nlohmann::json validate_policy(WorkerGroup& actor, const RLDataset& data, const RewardManager& reward,
                               const ValidationOptions& options) {
  const int64_t bs = options.batch_size.value_or(data.size());
  // per sample its data source, its prompt's uid, the reward and every reward_extra_info column
  std::vector<std::string> sources, uids;
  std::map<std::string, std::vector<nlohmann::json>> infos;
  std::vector<double> resp_lens;
  for (int64_t start = 0; start < data.size(); start += bs) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(start + bs, data.size()); ++i) idx.push_back(i);
    DataProto test = data.batch(idx);
    dataproto::Column uid;
    for (int64_t i : idx) uid.emplace_back("val-" + std::to_string(i));
    test.non_tensor_batch["uid"] = std::move(uid);
    test = test.repeat(options.n, true);
    DataProto gen = test.pop({"input_ids", "attention_mask", "position_ids"});
    if (options.multi_turn) agents::copy_agent_columns(test, gen);
    gen.meta_info["validate"] = true;
    gen.meta_info["do_sample"] = options.do_sample;
    auto [padded, pad] = pad_dataproto_to_divisor(gen, options.world);
    DataProto out = actor.call(&workers::ActorRolloutRefWorker::generate_sequences, padded);
    test.union_with(unpad_dataproto(out, pad));
    RewardOutput r = reward(test);
    const auto scores = r.reward_tensor.sum(-1).to(at::kDouble).contiguous();
    const int64_t T = test.batch.at("responses").size(1);
    const auto lens = test.batch.at("attention_mask").narrow(1, -T, T).sum(-1);
    for (int64_t i = 0; i < test.size(); ++i) {
      const auto row = static_cast<size_t>(i);
      sources.push_back(test.non_tensor_batch.at("data_source").at(row).get<std::string>());
      uids.push_back(test.non_tensor_batch.at("uid").at(row).get<std::string>());
      infos["reward"].push_back(scores[i].item<double>());
      resp_lens.push_back(lens[i].item<double>());
    }
    for (const auto& [key, values] : r.reward_extra_info)
      if (key != "reward") infos[key].insert(infos[key].end(), values.begin(), values.end());
  }
  nlohmann::json m = algos::metric_utils::validation_metric_sections(
      algos::metric_utils::process_validation_metrics(sources, uids, infos));
  double total = 0;
  for (double l : resp_lens) total += l;
  if (!resp_lens.empty()) m["val-aux/response_length/mean"] = total / static_cast<double>(resp_lens.size());
  return m;
}

}  // namespace hyflow::trainer
