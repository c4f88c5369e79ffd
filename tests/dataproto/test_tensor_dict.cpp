#include <hyflow/dataproto/tensor_dict.hpp>
#include <hyflow/core/error.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

using hyflow::TensorDict;

TEST_CASE("TensorDict keeps insertion order and a common batch size") {
  TensorDict td{{"b", torch::zeros({3, 2})}, {"a", torch::ones({3})}};
  CHECK(td.batch_size() == 3);
  CHECK(td.keys() == std::vector<std::string>{"b", "a"});
  CHECK(td.contains("a"));
  CHECK_FALSE(td.contains("c"));
  CHECK(td.at("a").sum().item<float>() == 3.f);
}

TEST_CASE("TensorDict rejects tensors whose dim 0 differs, naming key and sizes") {
  TensorDict td{{"x", torch::zeros({4, 2})}};
  try {
    td.set("y", torch::zeros({5}));
    FAIL("expected ShapeError");
  } catch (const hyflow::ShapeError& e) {
    CHECK_THAT(e.what(), Catch::Contains("'y'") && Catch::Contains("5 rows") && Catch::Contains("batch size is 4"));
  }
  CHECK_THROWS_AS(td.set("s", torch::tensor(1.0)), hyflow::ShapeError);
  CHECK_THROWS_AS(td.set("u", torch::Tensor()), hyflow::ValueError);
}

TEST_CASE("TensorDict replacing the only tensor may change the batch size") {
  TensorDict td{{"x", torch::zeros({4})}};
  td.set("x", torch::zeros({6}));
  CHECK(td.batch_size() == 6);
}

TEST_CASE("TensorDict::with_batch_size holds a batch size without keys") {
  auto td = TensorDict::with_batch_size(7);
  CHECK(td.empty());
  CHECK(td.batch_size() == 7);
  CHECK_THROWS_AS(td.set("x", torch::zeros({6})), hyflow::ShapeError);
  CHECK_THROWS_AS(TensorDict::with_batch_size(-1), hyflow::ShapeError);
}

TEST_CASE("TensorDict missing keys throw KeyError listing the keys present") {
  TensorDict td{{"x", torch::zeros({2})}};
  try {
    td.at("nope");
    FAIL("expected KeyError");
  } catch (const hyflow::KeyError& e) {
    CHECK_THAT(e.what(), Catch::Contains("'nope'") && Catch::Contains("[x]"));
  }
  CHECK_THROWS_AS(td.pop("nope"), hyflow::KeyError);
  CHECK_THROWS_AS(td.rename("nope", "y"), hyflow::KeyError);
}

TEST_CASE("TensorDict pop and rename") {
  TensorDict td{{"x", torch::zeros({2})}, {"y", torch::ones({2})}};
  td.rename("x", "z");
  CHECK(td.keys() == std::vector<std::string>{"z", "y"});
  CHECK_THROWS_AS(td.rename("z", "y"), hyflow::KeyError);  // target exists
  auto y = td.pop("y");
  CHECK(y.sum().item<float>() == 2.f);
  CHECK(td.keys() == std::vector<std::string>{"z"});
  td.pop("z");
  CHECK(td.batch_size() == 2);  // the batch size outlives its tensors, as in verl
}
