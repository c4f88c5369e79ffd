#include <hyflow/dataproto/serialization.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

using hyflow::dataproto::Column;
using hyflow::DataProto;
using hyflow::Json;
using hyflow::dataproto::NonTensorBatch;
using hyflow::TensorDict;

namespace {

bool identical(const DataProto& a, const DataProto& b) {
  if (a.batch.batch_size() != b.batch.batch_size() || a.batch.keys() != b.batch.keys()) return false;
  for (const auto& [k, t] : a.batch) {
    const auto& u = b.batch.at(k);
    if (t.scalar_type() != u.scalar_type() || t.sizes() != u.sizes()) return false;
    // Bitwise: NaNs and -0.0 must survive too.
    auto x = t.contiguous(), y = u.contiguous();
    if (x.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0) return false;
  }
  return a.non_tensor_batch.keys() == b.non_tensor_batch.keys() &&
         Json(a.meta_info).dump() == Json(b.meta_info).dump() &&
         [&] {
           for (const auto& [k, col] : a.non_tensor_batch)
             if (Json(col).dump() != Json(b.non_tensor_batch.at(k)).dump()) return false;
           return true;
         }();
}

DataProto sample() {
  NonTensorBatch nt;
  nt["uid"] = Column{"a", "b", "c"};
  nt["extra"] = Column{Json{{"k", 1}}, Json::array({1, 2.5, "x"}), nullptr};
  return DataProto(TensorDict{{"input_ids", torch::arange(12, torch::kLong).reshape({3, 4})},
                              {"logp", torch::randn({3, 4}).to(torch::kBFloat16)},
                              {"mask", torch::ones({3, 4}, torch::kBool)}},
                   nt, Json{{"temperature", 0.7}, {"metrics", {{"loss", {1.0, 2.0}}}}});
}

}  // namespace

TEST_CASE("serialize then deserialize is the identity on a typical batch") {
  auto d = sample();
  auto bytes = hyflow::dataproto::serialize(d);
  CHECK(bytes.size() == hyflow::dataproto::serialized_size(d));
  CHECK(std::memcmp(bytes.data(), "HYDP", 4) == 0);
  CHECK(identical(hyflow::dataproto::deserialize(bytes), d));
}

TEST_CASE("round trip keeps NaN, infinities and -0.0 bit for bit") {
  auto t = torch::tensor(std::vector<double>{NAN, INFINITY, -INFINITY, -0.0, 1e-310});
  NonTensorBatch nt;
  nt["score"] = Column{NAN, 1.5, -0.0, INFINITY, 2};
  DataProto d(TensorDict{{"v", t}}, nt);
  auto back = hyflow::dataproto::deserialize(hyflow::dataproto::serialize(d));
  CHECK(identical(back, d));
  CHECK(std::isnan(back.non_tensor_batch.at("score")[0].get<double>()));
}

TEST_CASE("round trip of non-contiguous, sliced and empty tensors") {
  auto base = torch::arange(60, torch::kFloat).reshape({6, 10});
  DataProto d(TensorDict{{"strided", base.t().slice(0, 2, 8)}, {"empty_trailing", torch::zeros({6, 0})}});
  auto back = hyflow::dataproto::deserialize(hyflow::dataproto::serialize(d));
  CHECK(torch::equal(back.batch.at("strided"), base.t().slice(0, 2, 8)));
  CHECK(back.batch.at("empty_trailing").sizes() == torch::IntArrayRef{6, 0});
  DataProto zero_rows(TensorDict{{"x", torch::zeros({0, 3})}});
  CHECK(identical(hyflow::dataproto::deserialize(hyflow::dataproto::serialize(zero_rows)), zero_rows));
  CHECK(identical(hyflow::dataproto::deserialize(hyflow::dataproto::serialize(DataProto())), DataProto()));
  CHECK(
      hyflow::dataproto::deserialize(hyflow::dataproto::serialize(DataProto(TensorDict::with_batch_size(5)))).size() ==
      5);
}

TEST_CASE("randomized round trips over shapes and dtypes") {
  std::mt19937_64 rng(1234);
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat,  torch::kDouble, torch::kHalf, torch::kBFloat16,
                                                 torch::kChar,   torch::kShort,  torch::kInt,  torch::kLong,
                                                 torch::kByte,   torch::kBool,   torch::kComplexFloat};
  torch::manual_seed(99);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 9);
    TensorDict td = TensorDict::with_batch_size(n);
    const int keys = static_cast<int>(rng() % 4);
    for (int k = 0; k < keys; ++k) {
      std::vector<int64_t> shape{n};
      for (size_t extra = rng() % 4; extra > 0; --extra) shape.push_back(static_cast<int64_t>(rng() % 4));
      auto dtype = dtypes[rng() % dtypes.size()];
      auto t = dtype == torch::kBool ? torch::rand(shape).gt(0.5)
                                     : (torch::randn(shape) * 100).to(dtype);
      td.set(std::string("k").append(std::to_string(k)), t);
    }
    NonTensorBatch nt;
    if (rng() % 2) {
      Column c;
      for (int64_t i = 0; i < n; ++i) c.push_back(Json{{"i", i}, {"s", std::string(rng() % 5, 'x')}});
      nt["col"] = c;
    }
    DataProto d(td, nt, Json{{"trial", trial}});
    INFO("trial " << trial << ": " << d.info());
    CHECK(identical(hyflow::dataproto::deserialize(hyflow::dataproto::serialize(d)), d));
  }
}

TEST_CASE("serialize_into reuses the buffer's capacity") {
  auto d = sample();
  std::vector<char> buf;
  hyflow::dataproto::serialize_into(d, buf);
  const auto* first = buf.data();
  hyflow::dataproto::serialize_into(d, buf);
  CHECK(buf.data() == first);
  CHECK(identical(hyflow::dataproto::deserialize(buf), d));
}

TEST_CASE("every truncation of an encoding raises FormatError") {
  auto bytes = hyflow::dataproto::serialize(sample());
  for (size_t len = 0; len < bytes.size(); ++len) {
    INFO("length " << len);
    CHECK_THROWS_AS(hyflow::dataproto::deserialize(std::span<const char>(bytes.data(), len)), hyflow::FormatError);
  }
}

TEST_CASE("trailing garbage, bad magic and unknown versions raise FormatError naming the problem") {
  auto bytes = hyflow::dataproto::serialize(sample());
  auto longer = bytes;
  longer.push_back('\0');
  CHECK_THROWS_WITH(hyflow::dataproto::deserialize(longer), Catch::Contains("trailing"));
  auto bad_magic = bytes;
  bad_magic[0] = 'X';
  CHECK_THROWS_WITH(hyflow::dataproto::deserialize(bad_magic), Catch::Contains("magic"));
  auto bad_version = bytes;
  bad_version[4] = 9;
  CHECK_THROWS_WITH(hyflow::dataproto::deserialize(bad_version), Catch::Contains("version 9"));
}

namespace {
// Offsets into the encoding of a batch with one int64 tensor "x" of shape (2, 3).
// magic(4) version(2) flags(2) batch_size(8) n_tensors(4) name_len(4) "x"(1) dtype(1) ndim(1)
constexpr size_t kDtypeOffset = 4 + 2 + 2 + 8 + 4 + 4 + 1;
constexpr size_t kNdimOffset = kDtypeOffset + 1;
constexpr size_t kDim0Offset = kNdimOffset + 1;
constexpr size_t kDim1Offset = kDim0Offset + 8;
constexpr size_t kNbytesOffset = kDim1Offset + 8;

std::vector<char> one_tensor() {
  return hyflow::dataproto::serialize(DataProto(TensorDict{{"x", torch::arange(6, torch::kLong).reshape({2, 3})}}));
}
template <class T>
void poke(std::vector<char>& b, size_t offset, T v) {
  std::memcpy(b.data() + offset, &v, sizeof v);
}
}  // namespace

TEST_CASE("hostile headers raise FormatError instead of allocating") {
  SECTION("unknown dtype code") {
    auto b = one_tensor();
    b[kDtypeOffset] = 77;
    CHECK_THROWS_WITH(hyflow::dataproto::deserialize(b), Catch::Contains("unknown dtype code 77"));
  }
  SECTION("negative dimension") {
    auto b = one_tensor();
    poke<int64_t>(b, kDim1Offset, -3);
    CHECK_THROWS_WITH(hyflow::dataproto::deserialize(b), Catch::Contains("negative dimension"));
  }
  SECTION("huge declared sizes") {
    auto b = one_tensor();
    poke<int64_t>(b, kDim1Offset, int64_t{1} << 40);
    poke<uint64_t>(b, kNbytesOffset, uint64_t{2} * 8 << 40);
    CHECK_THROWS_WITH(hyflow::dataproto::deserialize(b), Catch::Contains("remain"));
  }
  SECTION("multiplication overflow in the shape") {
    auto b = one_tensor();
    poke<int64_t>(b, kDim1Offset, int64_t{1} << 62);
    CHECK_THROWS_AS(hyflow::dataproto::deserialize(b), hyflow::FormatError);
  }
  SECTION("byte count that disagrees with the shape") {
    auto b = one_tensor();
    poke<uint64_t>(b, kNbytesOffset, 40);
    CHECK_THROWS_WITH(hyflow::dataproto::deserialize(b), Catch::Contains("declares 40 bytes"));
  }
  SECTION("too many dimensions") {
    auto b = one_tensor();
    b[kNdimOffset] = static_cast<char>(200);
    CHECK_THROWS_AS(hyflow::dataproto::deserialize(b), hyflow::FormatError);
  }
  SECTION("rows that disagree with the batch size") {
    auto b = one_tensor();
    poke<int64_t>(b, kDim0Offset, 1);
    CHECK_THROWS_WITH(hyflow::dataproto::deserialize(b), Catch::Contains("rows"));
  }
}

TEST_CASE("deeply nested CBOR in a column is rejected, not a stack overflow") {
  // A column whose CBOR is 100000 nested one-element arrays (0x81 ...) around a 0.
  std::vector<char> bytes = hyflow::dataproto::serialize(DataProto());
  // Rebuild: header, no tensors, one column "c" with the hostile CBOR, empty meta.
  std::vector<char> b(bytes.begin(), bytes.begin() + 16);
  auto put = [&b](auto v) {
    const char* p = reinterpret_cast<const char*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  };
  put(uint32_t{0});  // tensors
  put(uint32_t{1});  // columns
  put(uint32_t{1});
  b.push_back('c');
  std::vector<char> cbor(100000, static_cast<char>(0x81));
  cbor.push_back(0);
  put(static_cast<uint64_t>(cbor.size()));
  b.insert(b.end(), cbor.begin(), cbor.end());
  put(uint64_t{1});
  b.push_back(static_cast<char>(0xa0));  // {}
  CHECK_THROWS_WITH(hyflow::dataproto::deserialize(b), Catch::Contains("nests deeper"));
}

TEST_CASE("mutation: thousands of corrupted encodings never crash") {
  const auto good = hyflow::dataproto::serialize(sample());
  std::mt19937 rng(20261122);
  int rejected = 0, accepted = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    auto b = good;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) {
      const size_t pos = rng() % b.size();
      switch (rng() % 4) {
        case 0: b[pos] = static_cast<char>(rng()); break;                     // random byte
        case 1: b[pos] = static_cast<char>(b[pos] ^ (1 << (rng() % 8))); break;  // bit flip
        case 2: b.resize(pos); break;                                          // truncation
        default: b.insert(b.begin() + static_cast<long>(pos), static_cast<char>(rng())); break;  // insertion
      }
      if (b.empty()) break;
    }
    try {
      auto d = hyflow::dataproto::deserialize(b);
      d.check_consistency();  // what decodes must be a consistent batch
      ++accepted;
    } catch (const hyflow::FormatError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 3000);  // most mutations hit structure; payload-only flips decode fine
  CHECK(rejected + accepted == 4000);
}

TEST_CASE("save_to_file and load_from_file; a corrupt file names the file") {
  const auto dir = std::filesystem::temp_directory_path() / ("hyflow_dp_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "batch.hydp";
  auto d = sample();
  hyflow::dataproto::save_to_file(d, path);
  CHECK(identical(hyflow::dataproto::load_from_file(path), d));
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << "HYDPgarbage";
  }
  CHECK_THROWS_WITH(hyflow::dataproto::load_from_file(path), Catch::Contains("batch.hydp"));
  CHECK_THROWS_AS(hyflow::dataproto::load_from_file(dir / "missing.hydp"), hyflow::Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("tensor payloads start at 16-byte aligned offsets") {
  auto d = sample();
  auto bytes = hyflow::dataproto::serialize(d);
  // Find the int64 payload (0, 1, 2, ... 11) and check its offset.
  const auto ids = d.batch.at("input_ids").contiguous();
  auto it = std::search(bytes.begin(), bytes.end(), static_cast<const char*>(ids.data_ptr()),
                        static_cast<const char*>(ids.data_ptr()) + ids.nbytes());
  REQUIRE(it != bytes.end());
  CHECK((it - bytes.begin()) % 16 == 0);
}

TEST_CASE("deserialize_owned aliases the buffer instead of copying, and keeps it alive") {
  auto d = sample();
  auto bytes = hyflow::dataproto::serialize(d);
  const char* begin = bytes.data();
  const char* end = bytes.data() + bytes.size();
  auto decoded = hyflow::dataproto::deserialize_owned(std::move(bytes));
  const char* p = static_cast<const char*>(decoded.batch.at("input_ids").data_ptr());
  CHECK((p >= begin && p < end));
  CHECK(identical(decoded, d));
  auto ids = decoded.batch.at("input_ids");
  decoded = DataProto();  // the tensor alone keeps the buffer alive
  CHECK(torch::equal(ids, d.batch.at("input_ids")));
}

TEST_CASE("deserialize_owned rejects bad input like deserialize") {
  auto bytes = hyflow::dataproto::serialize(sample());
  bytes.resize(bytes.size() / 2);
  CHECK_THROWS_AS(hyflow::dataproto::deserialize_owned(std::move(bytes)), hyflow::FormatError);
}

TEST_CASE("non-zero alignment padding is rejected") {
  auto b = hyflow::dataproto::serialize(DataProto(TensorDict{{"x", torch::arange(6, torch::kLong).reshape({2, 3})}}));
  // Header 16 + counts 4 + name 5 + dtype/ndim 2 + dims 16 + nbytes 8 = 51: 13 bytes of padding follow.
  b[52] = 1;
  CHECK_THROWS_WITH(hyflow::dataproto::deserialize(b), Catch::Contains("padding"));
}
