#pragma once
// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the
// raw little-endian tensor bytes. Every offset is checked against the file before reading.

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::models {

/// Tensors in file order.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// Reads every tensor (CPU, contiguous). Malformed, truncated or inconsistent files raise
/// hyflow::FormatError naming the file and the tensor. Supported dtypes: F64 F32 F16 BF16
/// I64 I32 I16 I8 U8 BOOL.
NamedTensors read_safetensors(const std::filesystem::path& file, nlohmann::json* metadata = nullptr);

/// Writes tensors (any device/layout; stored contiguous, little-endian) in the given order.
/// `metadata` must be a JSON object of strings; {"format": "pt"} is added when absent.
void write_safetensors(const std::filesystem::path& file, const NamedTensors& tensors,
                       nlohmann::json metadata = nlohmann::json::object());

}  // namespace hyflow::models
