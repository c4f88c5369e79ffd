// Registry::expose: the text exposition format 0.0.4. Every family once (HELP, TYPE, then its
// series), the registry's series and the collectors' samples merged by name.
#include <hyflow/core/error.hpp>
#include <hyflow/metrics/registry.hpp>

#include <algorithm>

namespace hyflow::metrics {
namespace {

struct Snapshot {
  std::string help;
  MetricType type;
  std::vector<std::pair<Labels, double>> series;
};

void write_series(std::string& out, const std::string& name, const Labels& labels, double value) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out += ',';
      out += labels[i].first + "=\"" + escape_label_value(labels[i].second) + '"';
    }
    out += '}';
  }
  out += ' ' + format_value(value) + '\n';
}

}  // namespace

std::string Registry::expose() const {
  std::vector<Collector> collectors;
  {
    std::lock_guard lock(mutex_);
    collectors = collectors_;
  }
  // Collectors run unlocked: one may create series of this registry.
  CollectorSink sink;
  for (const auto& c : collectors) c(sink);

  std::map<std::string, Snapshot> families;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [name, f] : families_) {
      Snapshot& s = families[name];
      s.help = f.help;
      s.type = f.type;
      for (const auto& series : f.series)
        s.series.emplace_back(series.labels, series.counter ? series.counter->value() : series.gauge->value());
    }
  }
  for (auto& sample : sink.samples()) {
    check_metric_name(sample.name);
    check_labels(sample.name, sample.labels);
    auto [it, created] = families.try_emplace(sample.name, Snapshot{sample.help, sample.type, {}});
    Snapshot& f = it->second;
    if (f.type != sample.type)
      throw ValueError("collector: metric '" + sample.name + "' is a " + to_string(f.type) + ", not a " +
                       to_string(sample.type));
    if (f.help != sample.help) throw ValueError("collector: metric '" + sample.name + "' comes with two help texts");
    for (const auto& [labels, value] : f.series)
      if (same_label_set(labels, sample.labels))
        throw ValueError("collector: metric '" + sample.name + "' has the same series twice");
    f.series.emplace_back(std::move(sample.labels), sample.value);
  }

  std::string out;
  for (const auto& [name, f] : families) {
    out += "# HELP " + name + ' ' + escape_help(f.help) + '\n';
    out += "# TYPE " + name + ' ' + to_string(f.type) + '\n';
    for (const auto& [labels, value] : f.series) write_series(out, name, labels, value);
  }
  return out;
}

}  // namespace hyflow::metrics
