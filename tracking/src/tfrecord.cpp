// TFRecord framing: CRC-32C, the masked CRC, writing a record and reading a file back.
#include <hyflow/core/error.hpp>
#include <hyflow/tracking/tfrecord.hpp>

#include <array>
#include <fstream>

namespace hyflow::tracking {

namespace {

constexpr uint32_t kCastagnoli = 0x82F63B78;  // reflected
constexpr uint32_t kMaskDelta = 0xa282ead8;
constexpr size_t kHeaderBytes = 12;  // length + its CRC
constexpr size_t kFooterBytes = 4;   // the data's CRC

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kCastagnoli : 0);
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return value;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : data) crc = kCrcTable[(crc ^ static_cast<unsigned char>(c)) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string frame_tfrecord(std::string_view data) {
  std::string out;
  out.reserve(kHeaderBytes + data.size() + kFooterBytes);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

TfRecords read_tfrecords(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path.string());
  const uint64_t size = std::filesystem::file_size(path);
  const auto corrupt = [&](uint64_t offset, const std::string& what) {
    return FormatError(path.string() + ": the record at byte " + std::to_string(offset) + " is corrupt: " + what);
  };
  TfRecords result;
  uint64_t offset = 0;
  while (offset < size) {
    const uint64_t left = size - offset;
    if (left < kHeaderBytes) break;  // a header cut short
    char header[kHeaderBytes];
    if (!in.read(header, kHeaderBytes)) throw Error("cannot read " + path.string());
    const uint64_t length = get_le(header, 8);
    if (static_cast<uint32_t>(get_le(header + 8, 4)) != masked_crc32c(std::string_view(header, 8)))
      throw corrupt(offset, "the CRC of its length does not match");
    if (length > left - kHeaderBytes || left - kHeaderBytes - length < kFooterBytes) break;  // data cut short
    std::string data(length, '\0');
    char footer[kFooterBytes];
    if (!in.read(data.data(), static_cast<std::streamsize>(length)) || !in.read(footer, kFooterBytes))
      throw Error("cannot read " + path.string());
    if (static_cast<uint32_t>(get_le(footer, 4)) != masked_crc32c(data))
      throw corrupt(offset, "the CRC of its " + std::to_string(length) + " data bytes does not match");
    result.records.push_back(std::move(data));
    offset += kHeaderBytes + length + kFooterBytes;
  }
  result.valid_bytes = offset;
  result.truncated = offset < size;
  return result;
}

}  // namespace hyflow::tracking
