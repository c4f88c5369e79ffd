#include <hyflow/dataproto/data_proto.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>

using hyflow::dataproto::Column;
using hyflow::DataProto;
using hyflow::Json;
using hyflow::dataproto::NonTensorBatch;
using hyflow::TensorDict;

namespace {

/// n rows: obs = [[i, i+0.5]], ids = i (int64), uid column "u<i>".
DataProto make(int64_t n, bool auto_padding = false) {
  auto ids = torch::arange(n, torch::kLong);
  auto obs = torch::stack({ids.to(torch::kFloat), ids.to(torch::kFloat) + 0.5f}, 1);
  Column uid;
  for (int64_t i = 0; i < n; ++i) uid.push_back(std::string("u").append(std::to_string(i)));
  NonTensorBatch nt;
  nt["uid"] = uid;
  return DataProto::from_dict(TensorDict{{"obs", obs}, {"ids", ids}}, nt, Json{{"temperature", 1.0}}, auto_padding);
}

std::vector<int64_t> ids_of(const DataProto& d) {
  auto t = d.batch.at("ids").contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

std::vector<std::string> uids_of(const DataProto& d) {
  std::vector<std::string> out;
  for (const auto& v : d.non_tensor_batch.at("uid")) out.push_back(v.get<std::string>());
  return out;
}

bool same_rows(const DataProto& a, const DataProto& b) {
  if (a.size() != b.size() || a.batch.keys() != b.batch.keys()) return false;
  for (const auto& [k, t] : a.batch)
    if (!torch::equal(t, b.batch.at(k))) return false;
  return a.non_tensor_batch == b.non_tensor_batch;
}

}  // namespace

TEST_CASE("size: batch size, else first column length, else 0") {
  CHECK(make(5).size() == 5);
  CHECK(DataProto().size() == 0);
  NonTensorBatch nt;
  nt["a"] = Column{1, 2, 3};
  CHECK(DataProto(TensorDict(), nt).size() == 3);
}

TEST_CASE("construction rejects mismatched columns, naming key and sizes") {
  NonTensorBatch nt;
  nt["uid"] = Column{"a", "b"};
  try {
    DataProto(TensorDict{{"x", torch::zeros({3})}}, nt);
    FAIL("expected ShapeError");
  } catch (const hyflow::ShapeError& e) {
    CHECK_THAT(e.what(), Catch::Contains("'uid'") && Catch::Contains("2 rows") && Catch::Contains("has 3"));
  }
  CHECK_THROWS_AS(DataProto(TensorDict{{"x", torch::zeros({3})}}, {}, Json::array()), hyflow::ValueError);
}

TEST_CASE("item gives one sample with the batch dim removed") {
  auto d = make(4);
  auto it = d.item(-1);
  CHECK(it.batch.at("ids").item<int64_t>() == 3);
  CHECK(it.batch.at("obs").sizes() == torch::IntArrayRef{2});
  CHECK(it.non_tensor_batch.at("uid") == "u3");
  CHECK(it.meta_info["temperature"] == 1.0);
  CHECK_THROWS_AS(d.item(4), hyflow::ShapeError);
  CHECK_THROWS_AS(d.item(-5), hyflow::ShapeError);
}

TEST_CASE("slice follows Python semantics and shares storage") {
  auto d = make(10);
  CHECK(ids_of(d.slice(2, 5)) == std::vector<int64_t>{2, 3, 4});
  CHECK(ids_of(d.slice(-3, std::nullopt)) == std::vector<int64_t>{7, 8, 9});
  CHECK(ids_of(d.slice(std::nullopt, -8)) == std::vector<int64_t>{0, 1});
  CHECK(ids_of(d.slice(1, 8, 3)) == std::vector<int64_t>{1, 4, 7});
  CHECK(uids_of(d.slice(1, 8, 3)) == std::vector<std::string>{"u1", "u4", "u7"});
  CHECK(d.slice(5, 2).size() == 0);
  CHECK(d.slice(20, 30).size() == 0);
  CHECK_THROWS_AS(d.slice(0, 3, 0), hyflow::ValueError);
  auto s = d.slice(2, 5);
  CHECK(s.batch.at("obs").data_ptr() == d.batch.at("obs")[2].data_ptr());
  CHECK(s.meta_info == d.meta_info);
}

TEST_CASE("select_idxs by indices, negative indices, bool vector and tensors") {
  auto d = make(5);
  CHECK(ids_of(d.select_idxs(std::vector<int64_t>{4, 0, -1})) == std::vector<int64_t>{4, 0, 4});
  CHECK(uids_of(d.select_idxs(std::vector<int64_t>{4, 0})) == std::vector<std::string>{"u4", "u0"});
  CHECK(ids_of(d.select_idxs(std::vector<bool>{true, false, false, true, false})) == std::vector<int64_t>{0, 3});
  CHECK(ids_of(d.select_idxs(torch::tensor({false, true, true, false, false}))) == std::vector<int64_t>{1, 2});
  CHECK(ids_of(d.select_idxs(torch::tensor({3, 1}, torch::kInt))) == std::vector<int64_t>{3, 1});
  CHECK(d.select_idxs(std::vector<int64_t>{}).size() == 0);
  CHECK_THROWS_AS(d.select_idxs(std::vector<int64_t>{5}), hyflow::ShapeError);
  CHECK_THROWS_AS(d.select_idxs(std::vector<bool>{true}), hyflow::ShapeError);
  CHECK_THROWS_AS(d.select_idxs(torch::tensor({0.5f})), hyflow::ValueError);
  CHECK_THROWS_AS(d.select_idxs(torch::zeros({1, 1}, torch::kLong)), hyflow::ShapeError);
}

TEST_CASE("select keeps named keys; missing keys throw; deepcopy clones") {
  auto d = make(3);
  auto s = d.select(std::vector<std::string>{"ids"}, std::vector<std::string>{}, std::vector<std::string>{});
  CHECK(s.batch.keys() == std::vector<std::string>{"ids"});
  CHECK(s.non_tensor_batch.empty());
  CHECK(s.meta_info.empty());
  CHECK(s.batch.at("ids").data_ptr() == d.batch.at("ids").data_ptr());
  auto deep = d.select(std::nullopt, std::nullopt, std::nullopt, true);
  CHECK(deep.batch.at("ids").data_ptr() != d.batch.at("ids").data_ptr());
  CHECK(same_rows(deep, d));
  CHECK_THROWS_AS(d.select(std::vector<std::string>{"nope"}), hyflow::KeyError);
  CHECK_THROWS_AS(d.select(std::nullopt, std::vector<std::string>{"nope"}), hyflow::KeyError);
  CHECK_THROWS_AS(d.select(std::nullopt, std::nullopt, std::vector<std::string>{"nope"}), hyflow::KeyError);
}

TEST_CASE("pop removes keys and returns them; a missing key changes nothing") {
  auto d = make(3);
  CHECK_THROWS_AS(d.pop({"ids", "nope"}), hyflow::KeyError);
  CHECK(d.batch.keys() == std::vector<std::string>{"obs", "ids"});
  auto popped = d.pop({"ids"}, {"uid"}, {"temperature"});
  CHECK(popped.batch.keys() == std::vector<std::string>{"ids"});
  CHECK(popped.non_tensor_batch.contains("uid"));
  CHECK(popped.meta_info["temperature"] == 1.0);
  CHECK(d.batch.keys() == std::vector<std::string>{"obs"});
  CHECK(d.non_tensor_batch.empty());
  CHECK_FALSE(d.meta_info.contains("temperature"));
}

TEST_CASE("rename renames batch keys in place") {
  auto d = make(2);
  d.rename({"obs"}, {"observations"});
  CHECK(d.batch.keys() == std::vector<std::string>{"observations", "ids"});
  CHECK_THROWS_AS(d.rename({"ids"}, {}), hyflow::ValueError);
  CHECK_THROWS_AS(d.rename({"nope"}, {"x"}), hyflow::KeyError);
}

TEST_CASE("union_with merges new keys and accepts equal overlaps") {
  auto a = make(3);
  auto b = make(3).select(std::vector<std::string>{"ids"});
  b.batch.set("extra", torch::ones({3}));
  b.non_tensor_batch["score"] = Column{1.0, NAN, 3.0};
  b.meta_info["step"] = 7;
  a.union_with(b);
  CHECK(a.batch.keys() == std::vector<std::string>{"obs", "ids", "extra"});
  CHECK(a.non_tensor_batch.contains("score"));
  CHECK(a.meta_info["step"] == 7);
  // NaN equals NaN in column comparisons (verl's union_numpy_dict).
  DataProto again;
  again.non_tensor_batch["score"] = Column{1.0, NAN, 3.0};
  CHECK_NOTHROW(a.union_with(again));
}

TEST_CASE("union_with conflicts throw naming the key and leave the target unchanged") {
  auto a = make(3);
  auto b = make(3);
  b.batch.set("ids", torch::tensor({9, 9, 9}, torch::kLong));
  b.batch.set("new", torch::zeros({3}));
  try {
    a.union_with(b);
    FAIL("expected ValueError");
  } catch (const hyflow::ValueError& e) {
    CHECK_THAT(e.what(), Catch::Contains("'ids'"));
  }
  CHECK_FALSE(a.batch.contains("new"));
  auto c = make(3);
  c.meta_info["temperature"] = 0.5;
  CHECK_THROWS_WITH(make(3).union_with(c), Catch::Contains("temperature"));
  auto d = make(3);
  d.non_tensor_batch["uid"] = Column{"x", "y", "z"};
  CHECK_THROWS_WITH(make(3).union_with(d), Catch::Contains("uid"));
  CHECK_THROWS_AS(make(3).union_with(make(4)), hyflow::ShapeError);
}

TEST_CASE("chunk of 10 rows into 4 gives 3,3,3,1 with auto padding on") {
  auto d = make(10, true);
  auto parts = d.chunk(4);
  REQUIRE(parts.size() == 4);
  CHECK(parts[0].size() == 3);
  CHECK(parts[3].size() == 1);
  CHECK(uids_of(parts[3]) == std::vector<std::string>{"u9"});
  CHECK(parts[1].meta_info == d.meta_info);
}

TEST_CASE("chunk of unequal sizes without auto padding is an error naming the sizes") {
  CHECK_THROWS_WITH(make(10).chunk(4), Catch::Contains("10 rows") && Catch::Contains("4"));
  CHECK_THROWS_AS(make(10).chunk(0), hyflow::ValueError);
}

TEST_CASE("chunk into more pieces than rows gives fewer pieces (torch.chunk)") {
  auto parts = make(2, true).chunk(4);
  REQUIRE(parts.size() == 2);
  CHECK(parts[0].size() == 1);
}

TEST_CASE("chunk of an empty DataProto gives empty pieces") {
  auto parts = make(0).chunk(3);
  REQUIRE(parts.size() == 3);
  for (const auto& p : parts) CHECK(p.size() == 0);
}

TEST_CASE("split gives consecutive pieces, the last smaller") {
  auto parts = make(7).split(3);
  REQUIRE(parts.size() == 3);
  CHECK(ids_of(parts[2]) == std::vector<int64_t>{6});
  CHECK_THROWS_AS(make(7).split(0), hyflow::ValueError);
}

TEST_CASE("concat joins rows and gathers metrics into a dict of lists") {
  auto parts = make(6).chunk(3);
  parts[0].meta_info["metrics"] = Json{{"loss", 1.0}};
  parts[1].meta_info["metrics"] = Json::array({Json{{"loss", 2.0}}, Json{{"loss", 3.0}}});
  parts[2].meta_info["metrics"] = Json{{"loss", 4.0}};
  auto all = DataProto::concat(parts);
  CHECK(ids_of(all) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(all.meta_info["metrics"]["loss"] == Json::array({1.0, 2.0, 3.0, 4.0}));
  CHECK(all.meta_info["temperature"] == 1.0);
}

TEST_CASE("concat errors: no parts, mismatched keys, conflicting meta, trailing shapes") {
  CHECK_THROWS_AS(DataProto::concat({}), hyflow::ValueError);
  auto a = make(2), b = make(2);
  b.batch.pop("ids");
  CHECK_THROWS_AS(DataProto::concat({a, b}), hyflow::KeyError);
  auto c = make(2);
  c.meta_info["temperature"] = 2.0;
  CHECK_THROWS_WITH(DataProto::concat({a, c}), Catch::Contains("temperature"));
  auto e = make(2);
  e.batch.set("obs", torch::zeros({2, 3}));
  CHECK_THROWS_AS(DataProto::concat({a, e}), hyflow::ShapeError);
  auto f = make(2);
  f.non_tensor_batch.erase("uid");
  CHECK_THROWS_AS(DataProto::concat({a, f}), hyflow::KeyError);
}

TEST_CASE("reorder permutes rows in place") {
  auto d = make(4);
  d.reorder(torch::tensor({3, 1, 0, 2}));
  CHECK(ids_of(d) == std::vector<int64_t>{3, 1, 0, 2});
  CHECK(uids_of(d) == std::vector<std::string>{"u3", "u1", "u0", "u2"});
}

TEST_CASE("repeat interleaved gives a,a,b,b and tiled gives a,b,a,b") {
  auto d = make(2);
  CHECK(ids_of(d.repeat(2, true)) == std::vector<int64_t>{0, 0, 1, 1});
  CHECK(uids_of(d.repeat(2, true)) == std::vector<std::string>{"u0", "u0", "u1", "u1"});
  CHECK(ids_of(d.repeat(3, false)) == std::vector<int64_t>{0, 1, 0, 1, 0, 1});
  CHECK(uids_of(d.repeat(2, false)) == std::vector<std::string>{"u0", "u1", "u0", "u1"});
  CHECK(d.repeat(2, false).batch.at("obs").sizes() == torch::IntArrayRef{4, 2});
  CHECK_THROWS_AS(d.repeat(-1), hyflow::ValueError);
}

TEST_CASE("sample_level_repeat repeats each row its own number of times") {
  auto d = make(3);
  CHECK(ids_of(d.sample_level_repeat({2, 0, 1})) == std::vector<int64_t>{0, 0, 2});
  CHECK_THROWS_AS(d.sample_level_repeat({1, 1}), hyflow::ShapeError);
  CHECK_THROWS_AS(d.sample_level_repeat({1, -1, 1}), hyflow::ValueError);
}

TEST_CASE("padding appends copies of the last row, or the first") {
  auto d = make(3);
  d.padding(2);
  CHECK(ids_of(d) == std::vector<int64_t>{0, 1, 2, 2, 2});
  CHECK(uids_of(d).back() == "u2");
  auto f = make(3);
  f.padding(1, "first");
  CHECK(ids_of(f) == std::vector<int64_t>{0, 1, 2, 0});
  CHECK_THROWS_AS(make(0).padding(1), hyflow::ShapeError);
  CHECK_THROWS_AS(make(2).padding(1, "middle"), hyflow::ValueError);
  auto z = make(2);
  z.padding(0);
  CHECK(z.size() == 2);
}

TEST_CASE("pad_dataproto_to_divisor pads cyclically from the start; unpad undoes it") {
  auto d = make(3);
  auto [padded, pad] = hyflow::pad_dataproto_to_divisor(d, 8);
  CHECK(pad == 5);
  CHECK(ids_of(padded) == std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1});
  CHECK(padded.meta_info == d.meta_info);
  CHECK(same_rows(hyflow::unpad_dataproto(padded, pad), d));
  auto [same, none] = hyflow::pad_dataproto_to_divisor(make(4), 2);
  CHECK(none == 0);
  CHECK(same.size() == 4);
  CHECK_THROWS_AS(hyflow::pad_dataproto_to_divisor(d, 0), hyflow::ValueError);
  CHECK_THROWS_AS(hyflow::unpad_dataproto(d, 4), hyflow::ShapeError);
}

TEST_CASE("to(device) moves tensors in place") {
  auto d = make(2);
  d.batch.set("obs", d.batch.at("obs").to(torch::kDouble));
  d.to(torch::Device(torch::kCPU));
  CHECK(d.batch.at("obs").device().is_cpu());
}

TEST_CASE("group_indices groups non-contiguous rows by value in order of first appearance") {
  NonTensorBatch nt;
  nt["uid"] = Column{"b", "a", "b", "c", "a", 1, "1"};
  DataProto d(TensorDict{{"x", torch::zeros({7})}}, nt);
  auto groups = d.group_indices("uid");
  REQUIRE(groups.size() == 5);
  CHECK(groups[0].value == "b");
  CHECK(groups[0].indices == std::vector<int64_t>{0, 2});
  CHECK(groups[1].indices == std::vector<int64_t>{1, 4});
  CHECK(groups[3].value == 1);    // the number 1 and the string "1" are different uids
  CHECK(groups[4].value == "1");
  CHECK_THROWS_AS(d.group_indices("nope"), hyflow::KeyError);
}

TEST_CASE("make_iterator without shuffle yields consecutive mini-batches per epoch") {
  auto it = make(6).make_iterator({.mini_batch_size = 2, .epochs = 2});
  std::vector<std::vector<int64_t>> seen;
  while (auto mb = it.next()) {
    CHECK(mb->meta_info["temperature"] == 1.0);
    seen.push_back(ids_of(*mb));
  }
  REQUIRE(seen.size() == 6);
  CHECK(seen[0] == std::vector<int64_t>{0, 1});
  CHECK(seen[3] == std::vector<int64_t>{0, 1});
}

TEST_CASE("make_iterator with shuffle is a permutation per epoch and deterministic per seed") {
  auto run = [](uint64_t seed) {
    auto it = make(8).make_iterator({.mini_batch_size = 4, .epochs = 3, .shuffle = true, .seed = seed});
    std::vector<int64_t> order;
    while (auto mb = it.next()) {
      auto ids = ids_of(*mb);
      order.insert(order.end(), ids.begin(), ids.end());
    }
    return order;
  };
  auto a = run(42), b = run(42), c = run(43);
  REQUIRE(a.size() == 24);
  CHECK(a == b);
  CHECK(a != c);
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> epoch(a.begin() + 8 * e, a.begin() + 8 * (e + 1));
    std::sort(epoch.begin(), epoch.end());
    CHECK(epoch == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  }
  CHECK(std::vector<int64_t>(a.begin(), a.begin() + 8) != std::vector<int64_t>(a.begin() + 8, a.begin() + 16));
}

TEST_CASE("make_iterator rejects sizes that do not divide the batch") {
  CHECK_THROWS_AS(make(5).make_iterator({.mini_batch_size = 2}), hyflow::ShapeError);
  CHECK_THROWS_AS(make(4).make_iterator({.mini_batch_size = 0}), hyflow::ValueError);
  auto none = make(4).make_iterator({.mini_batch_size = 2, .epochs = 0});
  CHECK_FALSE(none.next().has_value());
}

TEST_CASE("collate stacks items back into a DataProto") {
  auto d = make(3);
  auto back = hyflow::collate({d.item(0), d.item(1), d.item(2)});
  CHECK(same_rows(back, d));
  CHECK_THROWS_AS(hyflow::collate({}), hyflow::ValueError);
}

TEST_CASE("operations work on bf16, bool and non-contiguous tensors") {
  auto base = torch::arange(24, torch::kFloat).reshape({4, 6});
  auto noncontig = base.t().slice(0, 0, 4);  // (4, 4) strided view
  REQUIRE_FALSE(noncontig.is_contiguous());
  DataProto d(TensorDict{{"bf", base.to(torch::kBFloat16)},
                         {"mask", base.gt(10)},
                         {"strided", noncontig}});
  auto parts = d.chunk(2);
  auto joined = DataProto::concat(parts);
  CHECK(torch::equal(joined.batch.at("bf"), d.batch.at("bf")));
  CHECK(torch::equal(joined.batch.at("mask"), d.batch.at("mask")));
  CHECK(torch::equal(joined.batch.at("strided"), noncontig));
  CHECK(torch::equal(d.repeat(2).batch.at("strided").slice(0, 0, 1), noncontig.slice(0, 0, 1)));
}

TEST_CASE("a DataProto with one sample survives every operation") {
  auto d = make(1);
  CHECK(d.chunk(1).size() == 1);
  CHECK(DataProto::concat(d.split(1)).size() == 1);
  CHECK(d.repeat(3).size() == 3);
  CHECK(hyflow::pad_dataproto_to_divisor(d, 4).second == 3);
  CHECK(d.make_iterator({.mini_batch_size = 1}).next().has_value());
}

TEST_CASE("randomized: chunk then concat and split then concat are identities") {
  torch::manual_seed(7);
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf,
                                                 torch::kLong, torch::kInt, torch::kByte, torch::kBool};
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = torch::randint(0, 40, {1}).item<int64_t>();
    const auto dtype = dtypes[static_cast<size_t>(trial) % dtypes.size()];
    std::vector<int64_t> shape{n};
    const int64_t extra = torch::randint(0, 3, {1}).item<int64_t>();
    for (int64_t k = 0; k < extra; ++k) shape.push_back(torch::randint(1, 5, {1}).item<int64_t>());
    auto t = torch::randint(0, 2, shape).to(dtype);
    Column col;
    for (int64_t i = 0; i < n; ++i) col.push_back(Json{{"row", i}});
    NonTensorBatch nt;
    nt["c"] = col;
    auto d = DataProto::from_dict(TensorDict{{"t", t}}, nt, Json::object(), true);
    const int64_t chunks = torch::randint(1, 9, {1}).item<int64_t>();
    INFO("n=" << n << " chunks=" << chunks << " dtype=" << c10::toString(dtype));
    CHECK(same_rows(DataProto::concat(d.chunk(chunks)), d));
    CHECK(same_rows(DataProto::concat(d.split(chunks)), d));
  }
}

TEST_CASE("info names sizes, keys, dtypes and shapes") {
  auto s = make(2).info();
  CHECK_THAT(s, Catch::Contains("size=2") && Catch::Contains("obs: Float[2, 2]") && Catch::Contains("uid"));
}

TEST_CASE("concat of chunk output is a view of the original storage; other parts are copied") {
  auto d = make(12);
  auto joined = DataProto::concat(d.chunk(4));
  CHECK(joined.batch.at("obs").data_ptr() == d.batch.at("obs").data_ptr());
  CHECK(torch::equal(joined.batch.at("obs"), d.batch.at("obs")));
  auto split = DataProto::concat(d.split(5));
  CHECK(split.batch.at("ids").data_ptr() == d.batch.at("ids").data_ptr());
  // Out of order or separately allocated parts get fresh storage.
  auto parts = d.chunk(4);
  std::swap(parts[0], parts[1]);
  auto swapped = DataProto::concat(parts);
  CHECK(swapped.batch.at("ids").data_ptr() != d.batch.at("ids").data_ptr());
  CHECK(ids_of(swapped) == std::vector<int64_t>{3, 4, 5, 0, 1, 2, 6, 7, 8, 9, 10, 11});
  auto fresh = DataProto::concat({make(2), make(3)});
  CHECK(ids_of(fresh) == std::vector<int64_t>{0, 1, 0, 1, 2});
  // Strided column views of a larger tensor are joined correctly too.
  auto wide = torch::arange(40, torch::kLong).reshape({10, 4});
  DataProto cols(TensorDict{{"c", wide.select(1, 2)}});
  CHECK(torch::equal(DataProto::concat(cols.split(3)).batch.at("c"), wide.select(1, 2)));
}
