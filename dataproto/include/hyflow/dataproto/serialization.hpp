#pragma once
// The DataProto wire format (docs/dataproto-format.md): a versioned binary encoding written
// with cereal. Tensors travel as dtype code + shape + little-endian raw bytes (bf16 included),
// columns and meta_info as CBOR. Decoding checks every size against the bytes that remain:
// truncated, corrupt or hostile input raises FormatError (naming the byte offset), never a
// crash and never an allocation larger than the input.

#include <hyflow/dataproto/data_proto.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace hyflow::dataproto {

/// First four bytes of every encoding: "HYDP".
inline constexpr char kWireMagic[4] = {'H', 'Y', 'D', 'P'};
/// Format version written; decoders accept exactly the versions they know.
inline constexpr uint16_t kWireVersion = 1;

/// Exact size of serialize(data) in bytes.
size_t serialized_size(const DataProto& data);
/// Encodes into a fresh buffer. Tensors on other devices are copied to the CPU first.
std::vector<char> serialize(const DataProto& data);
/// Encodes into `out`, replacing its contents and reusing its capacity.
void serialize_into(const DataProto& data, std::vector<char>& out);
/// Decodes one DataProto that spans all of `bytes` (trailing bytes are an error). Tensors
/// get their own storage (one copy of the payload).
DataProto deserialize(std::span<const char> bytes);
/// Like deserialize, but takes the buffer and lets the tensors alias it (no payload copy):
/// the buffer lives as long as any tensor decoded from it. Meant for received messages.
DataProto deserialize_owned(std::vector<char> bytes);

/// Writes serialize(data) to a file atomically (temporary file + rename).
void save_to_file(const DataProto& data, const std::filesystem::path& path);
/// Reads a file written by save_to_file; FormatError names the file on bad content.
DataProto load_from_file(const std::filesystem::path& path);

}  // namespace hyflow::dataproto
