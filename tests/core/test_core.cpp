#include <hyflow/core/error.hpp>
#include <hyflow/core/named_registry.hpp>
#include <hyflow/core/shape.hpp>
#include <hyflow/core/suggest.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

using namespace hyflow;
using Catch::Matchers::Contains;

TEST_CASE("edit_distance counts insertions, deletions and substitutions") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("flaw", "lawn") == 2);
}

TEST_CASE("closest_name suggests near names and nothing for far ones") {
  const std::vector<std::string> keys{"data.train_batch_size", "data.val_batch_size", "trainer.total_epochs"};
  CHECK(closest_name("data.train_batch_sise", keys) == "data.train_batch_size");
  CHECK(closest_name("trainer.total_epoch", keys) == "trainer.total_epochs");
  CHECK(closest_name("completely.different", keys).empty());
  CHECK(closest_name("x", {}).empty());
  CHECK(did_you_mean("trainer.total_epoch", keys) == "; did you mean 'trainer.total_epochs'?");
  CHECK(did_you_mean("zzz", keys).empty());
  CHECK(join_names({}) == "none");
  CHECK(join_names({"a", "b"}) == "a, b");
}

namespace {
/// Stands in for at::Tensor: shape_of only needs sizes().
struct FakeTensor {
  std::vector<int64_t> dims;
  const std::vector<int64_t>& sizes() const { return dims; }
};
}  // namespace

TEST_CASE("shape_of writes sizes as (2, 3); one dim is (7), no dims is ()") {
  CHECK(shape_of(FakeTensor{{2, 3}}) == "(2, 3)");
  CHECK(shape_of(FakeTensor{{7}}) == "(7)");
  CHECK(shape_of(FakeTensor{{}}) == "()");
  CHECK(shape_of(FakeTensor{{4, 0, 5}}) == "(4, 0, 5)");
}

TEST_CASE("NamedRegistry adds, refuses duplicates and names the registered entries on a miss") {
  NamedRegistry<int> r("dispatch mode", {{"ONE_TO_ALL", 1}});
  r.add("DP_COMPUTE_PROTO", 2);
  CHECK_THROWS_AS(r.add("DP_COMPUTE_PROTO", 3), ValueError);
  CHECK(r.get("DP_COMPUTE_PROTO") == 2);
  CHECK(r.contains("ONE_TO_ALL"));
  CHECK_FALSE(r.find("ALL_TO_ALL").has_value());
  CHECK(r.names() == std::vector<std::string>{"DP_COMPUTE_PROTO", "ONE_TO_ALL"});
  CHECK_THROWS_WITH(r.get("ONE_TO_AL"), Contains("unknown dispatch mode 'ONE_TO_AL'") &&
                                            Contains("registered: DP_COMPUTE_PROTO, ONE_TO_ALL") &&
                                            Contains("did you mean 'ONE_TO_ALL'?"));
  CHECK_THROWS_AS(r.replace("MISSING", 1), KeyError);
  r.replace("ONE_TO_ALL", 10);
  CHECK(r.get("ONE_TO_ALL") == 10);
  CHECK(r.add_or_get("ONE_TO_ALL", 99) == 10);
  CHECK(r.add_or_get("NEW", 5) == 5);
  r.set("NEW", 6);
  CHECK(r.get("NEW") == 6);
}

TEST_CASE("NamedRegistry::put adds, replaces only with overwrite, and refuses an empty function") {
  using Fn = std::function<int()>;
  const Fn one = [] { return 1; }, two = [] { return 2; };
  NamedRegistry<Fn> r("reward function");
  r.put("f", one, /*overwrite=*/false);
  CHECK_THROWS_WITH(r.put("f", two, false), Contains("reward function 'f' is already registered"));
  CHECK(r.get("f")() == 1);
  r.put("f", two, /*overwrite=*/true);
  CHECK(r.get("f")() == 2);
  CHECK_THROWS_WITH(r.put("none", nullptr, true), Contains("cannot register an empty reward function as 'none'"));
  CHECK_FALSE(r.contains("none"));
  NamedRegistry<int> zeros("execute mode");
  zeros.put("zero", 0, false);  // 0 is a value, not an empty one
  CHECK(zeros.get("zero") == 0);
}

TEST_CASE("NamedRegistry is safe to use from several threads") {
  NamedRegistry<int> r("worker type");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&r, t] {
      for (int i = 0; i < 100; ++i) {
        r.set("t" + std::to_string(t) + "_" + std::to_string(i), i);
        (void)r.names();
      }
    });
  for (auto& th : threads) th.join();
  CHECK(r.names().size() == 400);
}
