#pragma once
// Parquet files as verl's data preprocessing writes them (examples/data_preprocess/*.py: a
// pandas or datasets table saved through pyarrow): the rows of the columns asked for, nested
// ones included, as JSON. A reader of its own for the subset such files use (Debian has no
// Arrow): the Thrift compact footer, data pages v1 and v2, PLAIN and dictionary encodings,
// SNAPPY, GZIP, ZSTD or no compression, structs and lists at any depth.
//
//   auto rows = hyflow::trainer::read_parquet("train.parquet", {"prompt", "reward_model"});
//   rows[0]["prompt"][0]["content"]           // a chat message (list<struct<content, role>>)
//   rows[0]["reward_model"]["ground_truth"]   // a struct's field

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace hyflow::trainer {

/// True when the file at `path` starts with Parquet's magic bytes "PAR1".
bool is_parquet_file(const std::string& path);

/// The rows of a Parquet file, one JSON object each, keyed by the top-level columns read
/// (`columns`; empty: all; a name the file lacks is skipped, the caller checks what it needs).
/// Values: BYTE_ARRAY as a string, INT32/INT64 as integers (dates and timestamps as their
/// stored numbers), FLOAT/DOUBLE as numbers, BOOLEAN as true/false, a missing value as null; a
/// struct is an object, a list (LIST-annotated group, legacy two-level list or bare repeated
/// field) an array. What the reader does not support in a column it reads (INT96,
/// FIXED_LEN_BYTE_ARRAY, DECIMAL, MAP, DELTA_* or BYTE_STREAM_SPLIT encodings, LZ4, BROTLI or
/// LZO compression), and any damage, is a hyflow::FormatError naming the file and the column.
std::vector<nlohmann::json> read_parquet(const std::string& path, const std::vector<std::string>& columns = {});

}  // namespace hyflow::trainer
