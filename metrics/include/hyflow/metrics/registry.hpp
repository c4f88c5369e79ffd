#pragma once
// Registry: the metric families of a process (counters and gauges, each series a label set),
// updated lock-free from any thread, plus collectors that supply values living elsewhere at
// scrape time; expose() writes them all in the text exposition format 0.0.4.

#include <hyflow/metrics/names.hpp>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hyflow::metrics {

enum class MetricType { counter, gauge };
const char* to_string(MetricType type);

/// A monotonically increasing value (Prometheus counter). Lock-free.
class Counter {
 public:
  /// Adds `amount`; ValueError when it is negative or NaN (a counter never goes down).
  void inc(double amount = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// A value that goes up and down (Prometheus gauge). Lock-free.
class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1.0) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// One sample a collector reports.
struct Sample {
  std::string name;
  std::string help;
  MetricType type = MetricType::gauge;
  Labels labels;
  double value = 0.0;
};

/// What a collector writes into during a scrape.
class CollectorSink {
 public:
  void gauge(std::string name, std::string help, Labels labels, double value);
  void counter(std::string name, std::string help, Labels labels, double value);
  std::vector<Sample>& samples() { return samples_; }

 private:
  std::vector<Sample> samples_;
};

/// Called at every scrape, on the scraping thread; it must not block for long.
using Collector = std::function<void(CollectorSink&)>;

class Registry {
 public:
  /// The series of family `name` with `labels`, created on first use (the reference stays
  /// valid as long as the registry). ValueError for an invalid name or label, a family of
  /// that name with another type or help text, or labels whose names differ from the
  /// family's (every series of a family has the same label names).
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  /// Adds a collector, called by every expose().
  void add_collector(Collector collector);
  /// The text exposition format 0.0.4: per family (sorted by name) HELP, TYPE and its series.
  /// Samples of collectors join the family of their name. ValueError when a collector reports
  /// an invalid name, a type or help that differs from the family's, or a series twice.
  std::string expose() const;

 private:
  struct Series {
    Labels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
  };
  struct Family {
    std::string help;
    MetricType type;
    std::vector<std::string> label_names;
    std::deque<Series> series;
  };
  Series& series(const std::string& name, const std::string& help, MetricType type, const Labels& labels);

  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
  std::vector<Collector> collectors_;
};

}  // namespace hyflow::metrics
