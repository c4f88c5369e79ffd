#pragma once
// TFRecord framing, the container of TensorBoard's event files: each record is
//   uint64 length (little-endian) | uint32 masked CRC-32C of the length bytes |
//   data | uint32 masked CRC-32C of the data
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (TensorFlow's lib/hash/crc32c.h).

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace hyflow::tracking {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view data);
/// TensorFlow's masked CRC, stored in the records so that a CRC of CRCs does not look valid.
uint32_t masked_crc32c(std::string_view data);

/// One record around `data`, ready to append to a file.
std::string frame_tfrecord(std::string_view data);

/// The records of a file. A crash while a record was appended leaves a partial record at the
/// end: it is reported in `truncated`, and everything before it is returned.
struct TfRecords {
  std::vector<std::string> records;
  bool truncated = false;    ///< the file ends inside a record (a header or data cut short)
  uint64_t valid_bytes = 0;  ///< bytes of the complete records; the tail is file size - valid_bytes
};

/// Reads every record of `path`, checking both CRCs of each. A CRC that does not match is a
/// hyflow::FormatError naming the file and the record's byte offset; a length longer than the
/// rest of the file is a truncated tail (nothing is allocated beyond the file's size). Error
/// when the file cannot be read.
TfRecords read_tfrecords(const std::filesystem::path& path);

}  // namespace hyflow::tracking
