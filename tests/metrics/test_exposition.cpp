// The registry and the text exposition format 0.0.4: names, escaping, families, collectors.
#include <hyflow/core/error.hpp>
#include <hyflow/metrics/all.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <thread>

using namespace hyflow::metrics;

TEST_CASE("metric and label names follow Prometheus' rules") {
  CHECK(valid_metric_name("hyflow_node_calls_total"));
  CHECK(valid_metric_name("a:b_c9"));
  CHECK(valid_metric_name("_x"));
  CHECK_FALSE(valid_metric_name(""));
  CHECK_FALSE(valid_metric_name("9lives"));
  CHECK_FALSE(valid_metric_name("timing_s/step"));
  CHECK_FALSE(valid_metric_name("a-b"));
  CHECK(valid_label_name("peer"));
  CHECK_FALSE(valid_label_name("__name__"));
  CHECK_FALSE(valid_label_name("a:b"));
  CHECK_FALSE(valid_label_name("1x"));

  Registry r;
  CHECK_THROWS_AS(r.counter("bad name", "h"), hyflow::ValueError);
  CHECK_THROWS_WITH(r.gauge("ok", "h", {{"__x", "1"}}), Catch::Contains("invalid label name '__x'"));
  CHECK_THROWS_WITH(r.gauge("ok", "h", {{"a", "1"}, {"a", "2"}}), Catch::Contains("label 'a' given twice"));
}

TEST_CASE("a family keeps one type, one help text and one set of label names") {
  Registry r;
  r.counter("x_total", "things", {{"kind", "a"}}).inc();
  CHECK_THROWS_WITH(r.gauge("x_total", "things", {{"kind", "a"}}), Catch::Contains("is a counter, not a gauge"));
  CHECK_THROWS_WITH(r.counter("x_total", "other", {{"kind", "a"}}), Catch::Contains("another help text"));
  CHECK_THROWS_WITH(r.counter("x_total", "things", {{"peer", "a"}}), Catch::Contains("has labels {kind}"));
  // the same labels in another order are the same series
  Registry r2;
  Counter& a = r2.counter("y_total", "y", {{"a", "1"}, {"b", "2"}});
  Counter& b = r2.counter("y_total", "y", {{"b", "2"}, {"a", "1"}});
  CHECK(&a == &b);
}

TEST_CASE("counters only go up; gauges go both ways") {
  Registry r;
  Counter& c = r.counter("c_total", "c");
  c.inc();
  c.inc(2.5);
  CHECK(c.value() == 3.5);
  CHECK_THROWS_AS(c.inc(-1), hyflow::ValueError);
  CHECK_THROWS_AS(c.inc(std::nan("")), hyflow::ValueError);
  Gauge& g = r.gauge("g", "g");
  g.set(10);
  g.dec(4);
  g.inc();
  CHECK(g.value() == 7);
}

TEST_CASE("exposition: HELP and TYPE once per family, families sorted, escaping") {
  Registry r;
  r.gauge("zeta", "last family").set(1);
  r.counter("alpha_total", "first\\family\nsecond line", {{"path", "C:\\dir \"q\"\nx"}}).inc(2);
  r.counter("alpha_total", "first\\family\nsecond line", {{"path", "plain"}}).inc(1);
  const std::string text = r.expose();
  CHECK(text ==
        "# HELP alpha_total first\\\\family\\nsecond line\n"
        "# TYPE alpha_total counter\n"
        "alpha_total{path=\"C:\\\\dir \\\"q\\\"\\nx\"} 2\n"
        "alpha_total{path=\"plain\"} 1\n"
        "# HELP zeta last family\n"
        "# TYPE zeta gauge\n"
        "zeta 1\n");
}

TEST_CASE("values: shortest round trip, NaN and +Inf/-Inf spelled as Prometheus reads them") {
  CHECK(format_value(3) == "3");
  CHECK(format_value(0.1) == "0.1");
  CHECK(format_value(-2.5e-7) == "-2.5e-07");
  CHECK(format_value(1e21) == "1e+21");
  CHECK(format_value(std::numeric_limits<double>::quiet_NaN()) == "NaN");
  CHECK(format_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(std::stod(format_value(0.30000000000000004)) == 0.30000000000000004);
}

TEST_CASE("collectors join the family of their name at scrape time") {
  Registry r;
  r.gauge("age_seconds", "age", {{"peer", "a:1"}}).set(1);
  int scrapes = 0;
  r.add_collector([&](CollectorSink& out) {
    ++scrapes;
    out.gauge("age_seconds", "age", {{"peer", "b:2"}}, 0.5);
    out.counter("events_total", "events", {}, 7);
  });
  const std::string text = r.expose();
  CHECK(scrapes == 1);
  CHECK(text ==
        "# HELP age_seconds age\n# TYPE age_seconds gauge\nage_seconds{peer=\"a:1\"} 1\nage_seconds{peer=\"b:2\"} "
        "0.5\n# HELP events_total events\n# TYPE events_total counter\nevents_total 7\n");
  r.expose();
  CHECK(scrapes == 2);
}

TEST_CASE("a collector's invalid or conflicting sample makes expose throw, naming the metric") {
  SECTION("invalid name") {
    Registry r;
    r.add_collector([](CollectorSink& out) { out.gauge("timing_s/step", "t", {}, 1); });
    CHECK_THROWS_WITH(r.expose(), Catch::Contains("'timing_s/step'"));
  }
  SECTION("another type") {
    Registry r;
    r.gauge("x", "x").set(1);
    r.add_collector([](CollectorSink& out) { out.counter("x", "x", {{"a", "b"}}, 1); });
    CHECK_THROWS_WITH(r.expose(), Catch::Contains("metric 'x' is a gauge, not a counter"));
  }
  SECTION("a series twice") {
    Registry r;
    r.add_collector([](CollectorSink& out) {
      out.gauge("x", "x", {{"a", "1"}}, 1);
      out.gauge("x", "x", {{"a", "1"}}, 2);
    });
    CHECK_THROWS_WITH(r.expose(), Catch::Contains("the same series twice"));
  }
}

TEST_CASE("a collector may create series of its own registry (no deadlock)") {
  Registry r;
  r.add_collector([&r](CollectorSink&) { r.gauge("made_in_collector", "m").set(4); });
  r.expose();
  CHECK(r.expose().find("made_in_collector 4\n") != std::string::npos);
}

TEST_CASE("updates from many threads are all counted") {
  Registry r;
  Counter& c = r.counter("hits_total", "hits");
  Gauge& g = r.gauge("level", "level");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.inc();
        g.inc();
        g.dec(0.5);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(c.value() == 40000);
  CHECK(g.value() == 20000);
}

TEST_CASE("the process collector reports resident memory from /proc/self/statm") {
  Registry r;
  add_process_collector(r);
  const std::string text = r.expose();
  const auto at = text.find("\nprocess_resident_memory_bytes ");
  REQUIRE(at != std::string::npos);
  const double rss = std::stod(text.substr(at + 31));
  CHECK(rss > 1e6);  // a C++ test binary holds more than a megabyte
  CHECK(text.find("# TYPE process_cpu_seconds_total counter\n") != std::string::npos);
  CHECK(text.find("\nprocess_open_fds ") != std::string::npos);
}
