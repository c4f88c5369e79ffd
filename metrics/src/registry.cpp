// Registry: families of counters and gauges keyed by name, series keyed by label set.
#include <hyflow/core/error.hpp>
#include <hyflow/metrics/registry.hpp>

#include <algorithm>
#include <cmath>

namespace hyflow::metrics {

const char* to_string(MetricType type) {
  return type == MetricType::counter ? "counter" : "gauge";
}

void Counter::inc(double amount) {
  if (!(amount >= 0.0)) throw ValueError("a counter cannot be increased by " + format_value(amount));
  value_.fetch_add(amount, std::memory_order_relaxed);
}

void CollectorSink::gauge(std::string name, std::string help, Labels labels, double value) {
  samples_.push_back({std::move(name), std::move(help), MetricType::gauge, std::move(labels), value});
}

void CollectorSink::counter(std::string name, std::string help, Labels labels, double value) {
  samples_.push_back({std::move(name), std::move(help), MetricType::counter, std::move(labels), value});
}

namespace {

std::vector<std::string> names_of(const Labels& labels) {
  std::vector<std::string> names;
  for (const auto& l : labels) names.push_back(l.first);
  std::sort(names.begin(), names.end());
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s = "{";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "}";
}

}  // namespace

Registry::Series& Registry::series(const std::string& name, const std::string& help, MetricType type,
                                   const Labels& labels) {
  check_metric_name(name);
  check_labels(name, labels);
  std::lock_guard lock(mutex_);
  auto [it, created] = families_.try_emplace(name, Family{help, type, names_of(labels), {}});
  Family& f = it->second;
  if (!created) {
    if (f.type != type)
      throw ValueError("metric '" + name + "' is a " + to_string(f.type) + ", not a " + to_string(type));
    if (f.help != help) throw ValueError("metric '" + name + "' was registered with another help text");
    if (f.label_names != names_of(labels))
      throw ValueError("metric '" + name + "' has labels " + joined(f.label_names) + ", not " +
                       joined(names_of(labels)));
  }
  for (auto& s : f.series)
    if (same_label_set(s.labels, labels)) return s;
  Series& s = f.series.emplace_back();
  s.labels = labels;
  if (type == MetricType::counter)
    s.counter = std::make_unique<Counter>();
  else
    s.gauge = std::make_unique<Gauge>();
  return s;
}

Counter& Registry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  return *series(name, help, MetricType::counter, labels).counter;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  return *series(name, help, MetricType::gauge, labels).gauge;
}

void Registry::add_collector(Collector collector) {
  if (!collector) throw ValueError("Registry::add_collector: empty collector");
  std::lock_guard lock(mutex_);
  collectors_.push_back(std::move(collector));
}

}  // namespace hyflow::metrics
