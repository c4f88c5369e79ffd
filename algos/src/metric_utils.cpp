#include <hyflow/core/error.hpp>
#include <hyflow/algos/metric_utils.hpp>

#include "numpy_sum.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace hyflow::algos::metric_utils {
namespace {

double mean_of(const std::vector<double>& v) {
  return detail::numpy_mean(v);
}

double population_std(const std::vector<double>& v) {
  return detail::numpy_std(v);
}

// numpy's legacy bounded integers in [0, max]: 32-bit MT19937 outputs masked to the smallest
// 2^k - 1 covering max, redrawn while above it.
class LegacyIndexDraw {
 public:
  LegacyIndexDraw(uint32_t seed, uint32_t max) : rng_(seed), max_(max), mask_(max) {
    for (int shift = 1; shift < 32; shift <<= 1) mask_ |= mask_ >> shift;
  }
  size_t operator()() {
    if (max_ == 0) return 0;  // numpy draws nothing for a single choice
    uint32_t v;
    do v = static_cast<uint32_t>(rng_()) & mask_;
    while (v > max_);
    return v;
  }

 private:
  std::mt19937 rng_;
  uint32_t max_, mask_;
};

std::vector<int64_t> sizes_to_bootstrap(int64_t n_resps) {
  std::vector<int64_t> ns;
  if (n_resps <= 1) return ns;
  for (int64_t n = 2; n < n_resps; n *= 2) ns.push_back(n);
  ns.push_back(n_resps);
  return ns;
}

// "@k" (built by insertion: GCC 12 warns falsely on "@" + std::to_string(k))
std::string at(int64_t k) {
  std::string s = std::to_string(k);
  s.insert(s.begin(), '@');
  return s;
}

bool is_numeric(const nlohmann::json& v) { return v.is_number() || v.is_boolean(); }
double as_double(const nlohmann::json& v) { return v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>(); }

}  // namespace

std::vector<std::pair<double, double>> bootstrap_metric(size_t n_data, int64_t subset_size,
                                                        const std::vector<SubsetReduceFn>& reduce_fns,
                                                        int64_t n_bootstrap, uint32_t seed) {
  if (n_data == 0 || subset_size <= 0 || n_bootstrap <= 0)
    throw ValueError("bootstrap_metric: " + std::to_string(n_bootstrap) + " subsets of " + std::to_string(subset_size) +
                     " from " + std::to_string(n_data) + " samples");
  if (n_data - 1 > 0xFFFFFFFFull) throw ValueError("bootstrap_metric: more than 2^32 samples");
  LegacyIndexDraw draw(seed, static_cast<uint32_t>(n_data - 1));
  // all indices first, row by row, as numpy fills its (n_bootstrap, subset_size) array
  std::vector<std::vector<size_t>> subsets(static_cast<size_t>(n_bootstrap));
  for (auto& s : subsets) {
    s.resize(static_cast<size_t>(subset_size));
    for (auto& i : s) i = draw();
  }
  std::vector<std::pair<double, double>> out;
  out.reserve(reduce_fns.size());
  std::vector<double> results(subsets.size());
  for (const auto& fn : reduce_fns) {
    for (size_t b = 0; b < subsets.size(); ++b) results[b] = fn(subsets[b]);
    out.emplace_back(mean_of(results), population_std(results));
  }
  return out;
}

double calc_maj_val(const std::vector<nlohmann::json>& votes, const std::vector<double>& vals) {
  if (votes.empty() || votes.size() != vals.size())
    throw ValueError("calc_maj_val: " + std::to_string(votes.size()) + " votes for " + std::to_string(vals.size()) +
                     " values");
  // votes in first-seen order, with the first value and the count of each
  std::vector<std::pair<const nlohmann::json*, std::pair<double, size_t>>> seen;
  for (size_t i = 0; i < votes.size(); ++i) {
    auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& e) { return *e.first == votes[i]; });
    if (it == seen.end()) seen.push_back({&votes[i], {vals[i], 1}});
    else ++it->second.second;
  }
  auto best = seen.begin();
  for (auto it = seen.begin(); it != seen.end(); ++it)
    if (it->second.second > best->second.second) best = it;
  return best->second.first;
}

ValidationMetrics process_validation_metrics(const std::vector<std::string>& data_sources,
                                             const std::vector<std::string>& sample_uids,
                                             const std::map<std::string, std::vector<nlohmann::json>>& infos_dict,
                                             uint32_t seed) {
  const size_t n = data_sources.size();
  if (sample_uids.size() != n)
    throw ShapeError("process_validation_metrics: " + std::to_string(sample_uids.size()) + " uids for " +
                     std::to_string(n) + " samples");
  for (const auto& [var, vals] : infos_dict)
    if (vals.size() != n)
      throw ShapeError("process_validation_metrics: '" + var + "' has " + std::to_string(vals.size()) +
                       " values for " + std::to_string(n) + " samples");

  // data source -> uid -> sample indices, uids in first-seen order
  std::map<std::string, std::vector<std::pair<std::string, std::vector<size_t>>>> groups;
  for (size_t i = 0; i < n; ++i) {
    auto& uids = groups[data_sources[i]];
    auto it = std::find_if(uids.begin(), uids.end(), [&](const auto& u) { return u.first == sample_uids[i]; });
    if (it == uids.end()) uids.push_back({sample_uids[i], {i}});
    else it->second.push_back(i);
  }

  const std::vector<nlohmann::json>* preds = nullptr;
  if (auto it = infos_dict.find("pred"); it != infos_dict.end()) preds = &it->second;

  // data source -> var -> metric -> one value per uid
  std::map<std::string, std::map<std::string, std::map<std::string, std::vector<double>>>> per_uid;
  for (const auto& [source, uids] : groups) {
    for (const auto& [uid, rows] : uids) {
      for (const auto& [var, column] : infos_dict) {
        if (column[rows.front()].is_string()) continue;  // sizes were checked above
        std::vector<double> vals;
        vals.reserve(rows.size());
        for (size_t r : rows) {
          if (!is_numeric(column[r]))
            throw ValueError("process_validation_metrics: '" + var + "' of sample " + std::to_string(r) +
                             " is not a number: " + column[r].dump());
          vals.push_back(as_double(column[r]));
        }
        auto& metrics = per_uid[source][var];
        const auto n_resps = static_cast<int64_t>(vals.size());
        const std::string at_n = at(n_resps);
        metrics["mean" + at_n].push_back(mean_of(vals));
        if (n_resps <= 1) continue;
        metrics["std" + at_n].push_back(population_std(vals));
        std::vector<nlohmann::json> votes;
        if (preds)
          for (size_t r : rows) votes.push_back((*preds)[r]);
        for (int64_t k : sizes_to_bootstrap(n_resps)) {
          const std::string at_k = at(k);
          const auto bw = bootstrap_metric(
              vals.size(), k,
              {[&](const std::vector<size_t>& s) {
                 double m = vals[s[0]];
                 for (size_t i : s) m = std::max(m, vals[i]);
                 return m;
               },
               [&](const std::vector<size_t>& s) {
                 double m = vals[s[0]];
                 for (size_t i : s) m = std::min(m, vals[i]);
                 return m;
               }},
              1000, seed);
          metrics["best" + at_k + "/mean"].push_back(bw[0].first);
          metrics["best" + at_k + "/std"].push_back(bw[0].second);
          metrics["worst" + at_k + "/mean"].push_back(bw[1].first);
          metrics["worst" + at_k + "/std"].push_back(bw[1].second);
          if (preds) {
            const auto maj = bootstrap_metric(
                vals.size(), k,
                {[&](const std::vector<size_t>& s) {
                  std::vector<nlohmann::json> v;
                  std::vector<double> x;
                  for (size_t i : s) v.push_back(votes[i]), x.push_back(vals[i]);
                  return calc_maj_val(v, x);
                }},
                1000, seed);
            metrics["maj" + at_k + "/mean"].push_back(maj[0].first);
            metrics["maj" + at_k + "/std"].push_back(maj[0].second);
          }
        }
      }
    }
  }

  ValidationMetrics out;
  for (const auto& [source, vars] : per_uid)
    for (const auto& [var, metrics] : vars)
      for (const auto& [name, values] : metrics) out[source][var][name] = mean_of(values);
  return out;
}

nlohmann::json validation_metric_sections(const ValidationMetrics& metrics) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [source, vars] : metrics) {
    const std::string core_var = vars.count("acc") ? "acc" : "reward";
    for (const auto& [var, by_name] : vars) {
      int64_t n_max = 0;
      for (const auto& [name, value] : by_name) {
        const auto pos = name.rfind('@');
        n_max = std::max<int64_t>(n_max, std::stoll(name.substr(pos + 1, name.find('/', pos) - pos - 1)));
      }
      const std::string at_max = at(n_max);
      for (const auto& [name, value] : by_name) {
        const bool core = var == core_var && name.find(at_max) != std::string::npos &&
                          (name.rfind("mean", 0) == 0 || name.rfind("maj", 0) == 0 || name.rfind("best", 0) == 0);
        out[std::string(core ? "val-core/" : "val-aux/") + source + "/" + var + "/" + name] = value;
      }
    }
  }
  return out;
}

}  // namespace hyflow::algos::metric_utils
