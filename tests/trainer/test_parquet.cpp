// Parquet datasets as verl users have them: files written by real Parquet writers with verl's
// gsm8k schema (tests/trainer/parquet/write_fixtures.mjs: hyparquet-writer in pyarrow's layout
// with pages v2 and dictionaries, @dsnp/parquetjs with pages v1), read back row for row.
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/parquet.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace hyflow;
using namespace hyflow::trainer;
using Catch::Matchers::Contains;

namespace {

std::string fixture(const std::string& name) { return std::string(PARQUET_FIXTURES) + "/" + name; }

std::vector<nlohmann::json> expected_rows(const std::string& name) {
  std::ifstream in(fixture(name));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(!rows.empty());
  return rows;
}

const std::vector<std::string> kGsm8kFiles = {
    "gsm8k_v2_snappy.parquet",  "gsm8k_v2_zstd.parquet",   "gsm8k_v2_uncompressed.parquet",
    "gsm8k_v1_snappy.parquet",  "gsm8k_v1_gzip.parquet",
};

}  // namespace

TEST_CASE("verl's gsm8k parquet reads as its rows: pages v1 and v2, dictionaries, SNAPPY, GZIP, ZSTD, none") {
  const auto expected = expected_rows("expected.jsonl");
  for (const auto& name : kGsm8kFiles) {
    INFO(name);
    CHECK(is_parquet_file(fixture(name)));
    const auto rows = read_parquet(fixture(name));
    REQUIRE(rows.size() == expected.size());
    for (size_t i = 0; i < rows.size(); ++i) CHECK(rows[i] == expected[i]);
  }
  const auto rows = read_parquet(fixture("gsm8k_v2_snappy.parquet"));
  CHECK(rows[2]["prompt"].size() == 2);  // a system and a user message: a list of two structs
  CHECK(rows[2]["prompt"][0]["role"] == "system");
  CHECK(rows[0]["reward_model"]["ground_truth"] == "8");
  CHECK(rows[6]["extra_info"]["index"] == 6);
}

TEST_CASE("nesting at its edges: null and empty lists, null elements and fields, a list of lists") {
  const auto expected = expected_rows("expected_edges.jsonl");
  const auto rows = read_parquet(fixture("nested_edges.parquet"));  // two row groups
  REQUIRE(rows.size() == expected.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    INFO("row " << i << ": " << rows[i].dump());
    CHECK(rows[i] == expected[i]);
  }
}

TEST_CASE("only the columns asked for are read; what the reader lacks is a FormatError naming file and column") {
  const auto path = fixture("delta_index.parquet");  // extra_info.index is DELTA_BINARY_PACKED
  const auto rows = read_parquet(path, {"data_source", "prompt", "no_such_column"});
  REQUIRE(rows.size() == 7);
  CHECK(rows[0].size() == 2);
  CHECK(rows[0]["data_source"] == "openai/gsm8k");
  CHECK_THROWS_AS(read_parquet(path, {"extra_info"}), FormatError);
  CHECK_THROWS_WITH(read_parquet(path, {"extra_info"}), Contains("delta_index.parquet") &&
                                                            Contains("column 'extra_info.index'") &&
                                                            Contains("DELTA_BINARY_PACKED encoding is not supported"));
}

TEST_CASE("data.train_files=train.parquet: the samples of verl's columns, the same as the JSONL of the rows") {
  const SyntheticTask none;
  const auto from_parquet = load_samples(fixture("gsm8k_v1_snappy.parquet"), none);
  const auto from_jsonl = load_samples(fixture("expected.jsonl"), none);
  REQUIRE(from_parquet.size() == 7);
  REQUIRE(from_jsonl.size() == 7);
  for (size_t i = 0; i < from_parquet.size(); ++i) {
    CHECK(from_parquet[i].prompt == from_jsonl[i].prompt);
    CHECK(from_parquet[i].data_source == from_jsonl[i].data_source);
    CHECK(from_parquet[i].ground_truth == from_jsonl[i].ground_truth);
    CHECK(from_parquet[i].extra_info == from_jsonl[i].extra_info);
  }
  CHECK_THAT(from_parquet[0].prompt, Catch::StartsWith("Tom has 3 apples"));
  CHECK_THAT(from_parquet[2].prompt, Catch::StartsWith("You are a careful tutor.Mia reads"));  // contents joined
  CHECK(from_parquet[0].data_source == "openai/gsm8k");
  CHECK(from_parquet[0].ground_truth == "8");
  CHECK(from_parquet[3].extra_info["split"] == "train");
  // a list mixes both kinds
  const auto both = load_samples(fixture("gsm8k_v2_zstd.parquet") + "," + fixture("expected.jsonl"), none);
  CHECK(both.size() == 14);
  // a missing prompt column names the file and the row
  CHECK_THROWS_WITH(load_samples(fixture("gsm8k_v2_zstd.parquet"), none, "question"),
                    Contains("gsm8k_v2_zstd.parquet row 0") && Contains("missing column 'question'"));
}

TEST_CASE("a damaged parquet file is a FormatError naming the file") {
  const auto dir = std::filesystem::temp_directory_path() / "hyflow_test_parquet";
  std::filesystem::create_directories(dir);
  std::ifstream in(fixture("gsm8k_v2_snappy.parquet"), std::ios::binary);
  std::stringstream whole;
  whole << in.rdbuf();
  const std::string bytes = whole.str();
  SECTION("cut in the middle") {
    const auto cut = (dir / "cut.parquet").string();
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    CHECK(is_parquet_file(cut));
    CHECK_THROWS_WITH(read_parquet(cut), Contains("cut.parquet") && Contains("not a Parquet file"));
  }
  SECTION("pages overwritten") {
    const auto broken = (dir / "broken.parquet").string();
    std::string copy = bytes;
    for (size_t i = 4; i < copy.size() / 2; ++i) copy[i] = static_cast<char>(0xff);
    std::ofstream(broken, std::ios::binary) << copy;
    CHECK_THROWS_AS(read_parquet(broken), FormatError);
    CHECK_THROWS_WITH(read_parquet(broken), Contains("broken.parquet"));
  }
  SECTION("a JSONL file is not taken for Parquet") { CHECK_FALSE(is_parquet_file(fixture("expected.jsonl"))); }
  std::filesystem::remove_all(dir);
}
