#pragma once
// Validation metrics of verl's trainer/ppo/metric_utils.py: per data source, per prompt (uid)
// and per variable (the reward and every numeric reward_extra_info key) mean@N, std@N and
// bootstrapped best@n / worst@n / maj@n, averaged over prompts; then split into val-core/*
// and val-aux/* as ray_trainer._validate does. The bootstrap draws indices exactly as numpy's
// RandomState(seed).choice(n, size=(n_bootstrap, n)) does, so the figures equal verl's.

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

/// verl's compute_data_metrics into `metrics`: critic/score|rewards|advantages|returns|values
/// /{mean,max,min}, critic/vf_explained_var (with a critic), response_length/{mean,max,min,
/// clip_ratio}, prompt_length/{mean,max,min,clip_ratio}.
void compute_data_metrics(const dataproto::DataProto& batch, bool use_critic, nlohmann::json& metrics);
/// verl's compute_timing_metrics and compute_throughout_metrics from the timing_s/* entries
/// already in `metrics`: timing_per_token_ms/*, perf/total_num_tokens, perf/time_per_step,
/// perf/throughput (tokens per second per rank over `world` ranks).
void compute_timing_and_throughput_metrics(const dataproto::DataProto& batch, int64_t world,
                                           nlohmann::json& metrics);
/// Reduces one metric's values gathered from the workers (nested per rank) like verl's
/// reduce_metrics: names containing "max" take the max, then "min" the min, else the mean.
/// ValueError naming the metric when it holds a non-number or no value.
double reduce_metric(const std::string& name, const nlohmann::json& values);

}  // namespace hyflow::algos::metric_utils
