// Validation metrics (verl's process_validation_metrics). Means and stds are derived by hand;
// the bootstrap figures were computed with numpy: np.random.seed(42) then
// np.random.choice(n, size=(1000, k), replace=True), as verl's bootstrap_metric does.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/metric_utils.hpp>

#include <catch2/catch.hpp>

using namespace hyflow::algos::metric_utils;
using Json = nlohmann::json;

TEST_CASE("bootstrap_metric draws numpy's RandomState(42) indices: best and worst of 2 out of 5") {
  const std::vector<double> v{0.1, 0.9, 0.4, 0.7, 0.2};
  auto max_of = [&](const std::vector<size_t>& s) {
    double m = v[s[0]];
    for (size_t i : s) m = std::max(m, v[i]);
    return m;
  };
  auto min_of = [&](const std::vector<size_t>& s) {
    double m = v[s[0]];
    for (size_t i : s) m = std::min(m, v[i]);
    return m;
  };
  const auto r = bootstrap_metric(v.size(), 2, {max_of, min_of});
  CHECK(r[0].first == Approx(0.6181).margin(1e-12));
  CHECK(r[0].second == Approx(0.27514067311104695).margin(1e-12));
  CHECK(r[1].first == Approx(0.2949).margin(1e-12));
  CHECK(r[1].second == Approx(0.23512547713933513).margin(1e-12));
  // the first subsets are numpy's [[3, 4], [2, 4], [4, 1], [2, 2]] (choice(5, (2, 4)) reshaped)
  std::vector<std::vector<size_t>> first;
  (void)bootstrap_metric(5, 2, {[&](const std::vector<size_t>& s) {
                           if (first.size() < 4) first.push_back(s);
                           return 0.0;
                         }});
  CHECK(first == std::vector<std::vector<size_t>>{{3, 4}, {2, 4}, {4, 1}, {2, 2}});
  CHECK_THROWS_AS(bootstrap_metric(0, 2, {max_of}), hyflow::ValueError);
}

TEST_CASE("calc_maj_val returns the first value of the most common vote, first-seen on ties") {
  CHECK(calc_maj_val({"A", "B", "A"}, {0.9, 0.8, 0.7}) == 0.9);
  CHECK(calc_maj_val({"B", "A"}, {1.0, 2.0}) == 1.0);
  CHECK(calc_maj_val({"x", "y", "y"}, {0.0, 0.5, 1.0}) == 0.5);
  CHECK_THROWS_AS(calc_maj_val({"x"}, {}), hyflow::ValueError);
}

TEST_CASE("process_validation_metrics: per-uid stats averaged over uids, bools as 0/1, pred votes") {
  // uid a: rewards 1,0,0,1 (mean .5, std .5); uid b: 0,0,1,0 (mean .25, std sqrt(3)/4)
  const std::vector<std::string> sources(8, "arith");
  const std::vector<std::string> uids{"a", "a", "a", "a", "b", "b", "b", "b"};
  std::map<std::string, std::vector<Json>> infos{
      {"reward", {1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0}},
      {"acc", {true, false, false, true, false, false, true, false}},
      {"pred", {"7", "3", "3", "7", "1", "2", "5", "2"}}};
  const auto m = process_validation_metrics(sources, uids, infos);
  REQUIRE(m.count("arith"));
  const auto& vars = m.at("arith");
  CHECK_FALSE(vars.count("pred"));  // strings are votes, not variables
  for (const char* var : {"reward", "acc"}) {
    const auto& r = vars.at(var);
    CAPTURE(var);
    CHECK(r.at("mean@4") == Approx(0.375).margin(1e-15));
    CHECK(r.at("std@4") == Approx((0.5 + std::sqrt(3.0) / 4) / 2).margin(1e-15));
    CHECK(r.at("best@2/mean") == Approx(0.5785).margin(1e-12));
    CHECK(r.at("best@2/std") == Approx(0.466559009417502).margin(1e-12));
    CHECK(r.at("best@4/mean") == Approx(0.7935).margin(1e-12));
    CHECK(r.at("worst@2/mean") == Approx(0.175).margin(1e-12));
    CHECK(r.at("worst@4/mean") == Approx(0.042).margin(1e-12));
    CHECK(r.at("worst@4/std") == Approx(0.15952066828577277).margin(1e-12));
    CHECK(r.at("maj@2/mean") == Approx(0.3815).margin(1e-12));
    CHECK(r.at("maj@4/mean") == Approx(0.349).margin(1e-12));
    CHECK(r.at("maj@4/std") == Approx(0.44364407739746414).margin(1e-12));
    CHECK(r.size() == 14);  // mean, std, and best/worst/maj mean/std at 2 and 4
  }
  CHECK_THROWS_AS(process_validation_metrics(sources, {"a"}, infos), hyflow::ShapeError);
}

TEST_CASE("one sample per uid gives mean@1 only; sections put the core variable's top-n metrics in val-core") {
  const auto one = process_validation_metrics({"s", "s"}, {"u", "v"}, {{"reward", {1.0, 0.0}}});
  CHECK(one.at("s").at("reward") == std::map<std::string, double>{{"mean@1", 0.5}});
  CHECK(validation_metric_sections(one) == Json{{"val-core/s/reward/mean@1", 0.5}});

  const auto m = process_validation_metrics(
      {"s", "s", "s", "s"}, {"u", "u", "u", "u"},
      {{"reward", {1.0, 0.0, 1.0, 1.0}}, {"acc", {true, false, true, true}}, {"pred", {"1", "2", "1", "1"}}});
  const auto sections = validation_metric_sections(m);
  // core variable: acc (present); core metrics: mean/maj/best at n = 4 (their /std too, as verl)
  for (const char* k : {"val-core/s/acc/mean@4", "val-core/s/acc/best@4/mean", "val-core/s/acc/best@4/std",
                        "val-core/s/acc/maj@4/mean", "val-core/s/acc/maj@4/std", "val-aux/s/acc/std@4",
                        "val-aux/s/acc/best@2/mean", "val-aux/s/acc/worst@4/mean", "val-aux/s/reward/mean@4",
                        "val-aux/s/reward/best@4/mean"}) {
    CAPTURE(k);
    CHECK(sections.contains(k));
  }
  CHECK(sections.at("val-core/s/acc/mean@4") == 0.75);
  CHECK(sections.size() == 28);
}
