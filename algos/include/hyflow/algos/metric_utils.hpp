#pragma once
// Validation metrics of verl's trainer/ppo/metric_utils.py: per data source, per prompt (uid)
// and per variable (the reward and every numeric reward_extra_info key) mean@N, std@N and
// bootstrapped best@n / worst@n / maj@n, averaged over prompts; then split into val-core/*
// and val-aux/* as ray_trainer._validate does. The bootstrap draws indices exactly as numpy's
// RandomState(seed).choice(n, size=(n_bootstrap, n)) does, so the figures equal verl's.
// Also the training metrics: compute_data_metrics, compute_timing_metrics,
// compute_throughout_metrics and reduce_metrics.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::dataproto {
class DataProto;
}

namespace hyflow::algos::metric_utils {

/// One statistic of a bootstrap subset, given the indices drawn into it.
using SubsetReduceFn = std::function<double(const std::vector<size_t>& subset)>;

/// n_bootstrap subsets of `subset_size` indices drawn with replacement from [0, n_data)
/// (MT19937 seeded with `seed`, masked rejection like numpy's legacy RandomState); for each
/// reduce function, the mean and the population std of its value over the subsets.
/// ValueError when n_data or subset_size is 0.
std::vector<std::pair<double, double>> bootstrap_metric(size_t n_data, int64_t subset_size,
                                                        const std::vector<SubsetReduceFn>& reduce_fns,
                                                        int64_t n_bootstrap = 1000, uint32_t seed = 42);

/// Majority vote: the value of the first sample whose vote is the most common one (ties: the
/// vote seen first). `votes` and `vals` are parallel; ValueError when empty or of unequal size.
double calc_maj_val(const std::vector<nlohmann::json>& votes, const std::vector<double>& vals);

/// data source -> variable -> metric name ("mean@4", "std@4", "best@2/mean", ...) -> value.
using ValidationMetrics = std::map<std::string, std::map<std::string, std::map<std::string, double>>>;

/// verl's process_validation_metrics. `infos_dict` maps a variable to one value per sample;
/// variables whose first value is a string are skipped ("pred" then serves as the vote of
/// maj@n), booleans count as 0/1. n = 2, 4, 8, ... below N, and N, for N > 1 samples per uid.
/// ShapeError when a column's length differs from data_sources'.
ValidationMetrics process_validation_metrics(const std::vector<std::string>& data_sources,
                                             const std::vector<std::string>& sample_uids,
                                             const std::map<std::string, std::vector<nlohmann::json>>& infos_dict,
                                             uint32_t seed = 42);

/// The metrics as ray_trainer._validate logs them: "val-core/{source}/{var}/{metric}" for the
/// core variable ("acc" when present, else "reward") and metric names starting with mean, maj
/// or best at the largest n; everything else under "val-aux/".
nlohmann::json validation_metric_sections(const ValidationMetrics& metrics);

/// verl's compute_data_metrics. Reads token_level_scores, token_level_rewards, advantages,
/// returns, response_mask, responses, attention_mask (and values with a critic); statistics are
/// computed in the tensors' dtype, as verl's torch calls do. Keys: critic/score and
/// critic/rewards /{mean,max,min} over the non-aborted rows (response length > 0, from
/// attention_mask); critic/advantages, critic/returns (and critic/values) /{mean,max,min} over
/// response_mask; critic/vf_explained_var with a critic; response_length/{mean,max,min,
/// clip_ratio} over all rows; response_length_non_aborted/{mean,max,min,clip_ratio};
/// response/aborted_ratio; prompt_length/{mean,max,min,clip_ratio}; num_turns/{min,max,mean}
/// and tool_call_counts/{min,max,mean} when the non-tensor columns "__num_turns__" and
/// "tool_call_counts" exist. ValueError when every response is empty (verl raises too) or a
/// masked selection is empty; KeyError naming a missing tensor.
nlohmann::json compute_data_metrics(const dataproto::DataProto& batch, bool use_critic = true);

/// verl's compute_timing_metrics: timing_s/{name} for every entry of `timing_raw` (seconds),
/// and timing_per_token_ms/{name} for gen (per response token) and ref, values, adv,
/// update_critic, update_actor (per prompt + response token) where timed. ValueError when a
/// timed section has no tokens to divide by.
nlohmann::json compute_timing_metrics(const dataproto::DataProto& batch,
                                      const std::map<std::string, double>& timing_raw);

/// verl's compute_throughout_metrics (verl's spelling): perf/total_num_tokens = Σ
/// meta_info["global_token_num"], perf/time_per_step = timing_raw["step"], perf/throughput =
/// tokens / (time · n_gpus). KeyError naming a missing key.
nlohmann::json compute_throughout_metrics(const dataproto::DataProto& batch,
                                          const std::map<std::string, double>& timing_raw, int64_t n_gpus);

/// verl's reduce_metrics on a JSON object name -> values (a number or a list, nested lists
/// flattened, booleans as 0/1): names containing "max" take the max, else names containing
/// "min" the min, else the mean (NaN for no values, as numpy). ValueError naming the metric
/// for a non-number, or for max/min of no values (numpy raises).
std::map<std::string, double> reduce_metrics(const nlohmann::json& metrics);

}  // namespace hyflow::algos::metric_utils
