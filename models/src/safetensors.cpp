#include <hyflow/models/safetensors.hpp>

#include <hyflow/core/error.hpp>

#include <torch/torch.h>

#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

namespace hyflow::models {
namespace {

using Json = nlohmann::json;

constexpr std::array<std::pair<const char*, at::ScalarType>, 10> kDtypes{{
    {"F64", at::kDouble},
    {"F32", at::kFloat},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"I64", at::kLong},
    {"I32", at::kInt},
    {"I16", at::kShort},
    {"I8", at::kChar},
    {"U8", at::kByte},
    {"BOOL", at::kBool},
}};

// Headers beyond this are refused rather than parsed (the reference reader uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

at::ScalarType dtype_from_name(const std::string& name, const std::string& where) {
  for (const auto& [n, t] : kDtypes) {
    if (name == n) return t;
  }
  throw FormatError(where + ": unsupported dtype '" + name + "'");
}

const char* dtype_name(at::ScalarType type, const std::string& where) {
  for (const auto& [n, t] : kDtypes) {
    if (type == t) return n;
  }
  throw ValueError(where + ": dtype " + std::string(c10::toString(type)) + " cannot be stored in safetensors");
}

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

NamedTensors read_safetensors(const std::filesystem::path& file, Json* metadata) {
  const std::string fname = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw FormatError(fname + ": cannot open safetensors file");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const uint64_t size = bytes.size();
  if (size < 8) throw FormatError(fname + ": truncated: " + std::to_string(size) + " bytes, no header length");
  const uint64_t header_len = read_le64(bytes.data());
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    throw FormatError(fname + ": header length " + std::to_string(header_len) + " exceeds the file (" +
                      std::to_string(size) + " bytes)");
  }
  Json header;
  try {
    header = Json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(header_len));
  } catch (const Json::exception& e) {
    throw FormatError(fname + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw FormatError(fname + ": header is not a JSON object");
  const uint64_t data_start = 8 + header_len, data_size = size - data_start;

  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    at::ScalarType dtype;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (metadata) *metadata = entry;
      continue;
    }
    const std::string where = fname + ": tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      throw FormatError(where + ": entry needs dtype, shape and data_offsets");
    }
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
    at::ScalarType dtype;
    try {
      dtype = dtype_from_name(entry.at("dtype").get<std::string>(), where);
      for (const auto& d : entry.at("shape")) {
        if (!d.is_number_unsigned()) throw FormatError(where + ": shape entries must be non-negative integers");
        if (d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          throw FormatError(where + ": shape entry " + d.dump() + " overflows 64-bit sizes");
        shape.push_back(d.get<int64_t>());
      }
      const auto& offsets = entry.at("data_offsets");
      if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
          !offsets[1].is_number_unsigned()) {
        throw FormatError(where + ": data_offsets must be [begin, end]");
      }
      begin = offsets[0].get<uint64_t>();
      end = offsets[1].get<uint64_t>();
    } catch (const Json::exception& e) {
      throw FormatError(where + ": malformed entry: " + e.what());
    }
    if (begin > end || end > data_size) {
      throw FormatError(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") lie outside the " + std::to_string(data_size) + " data bytes (file truncated?)");
    }
    // numel x element size in bytes, refusing any product that does not fit (LibTorch takes
    // int64 sizes, and a wrapped product would pass the length check below).
    constexpr uint64_t kMaxBytes = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    uint64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0 || (d != 0 && numel > kMaxBytes / static_cast<uint64_t>(d)))
        throw FormatError(where + ": shape " + entry.at("shape").dump() + " overflows 64-bit sizes");
      numel *= static_cast<uint64_t>(d);
    }
    const uint64_t element_size = c10::elementSize(dtype);
    if (numel > kMaxBytes / element_size)
      throw FormatError(where + ": shape " + entry.at("shape").dump() + " x " + std::to_string(element_size) +
                        "-byte elements overflows 64-bit sizes");
    const uint64_t expected = numel * element_size;
    if (end - begin != expected) {
      throw FormatError(where + ": " + std::to_string(end - begin) + " bytes for shape of " + std::to_string(numel) +
                        " elements, expected " + std::to_string(expected));
    }
    entries.push_back({name, std::move(shape), dtype, begin, end});
  }
  // As the reference reader: the tensors tile the data section exactly, in offset order, with
  // no overlap (two names reading the same bytes) and no gap.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin < covered)
      throw FormatError(fname + ": tensor '" + e.name + "' data_offsets [" + std::to_string(e.begin) + ", " +
                        std::to_string(e.end) + ") overlap tensor '" + entries[i - 1].name + "' (ends at " +
                        std::to_string(covered) + ")");
    if (e.begin > covered)
      throw FormatError(fname + ": " + std::to_string(e.begin - covered) + " data bytes at offset " +
                        std::to_string(covered) + " belong to no tensor (before tensor '" + e.name + "')");
    covered = e.end;
  }
  if (covered != data_size)
    throw FormatError(fname + ": " + std::to_string(data_size - covered) + " data bytes at offset " +
                      std::to_string(covered) + " belong to no tensor");

  NamedTensors out;
  for (const Entry& e : entries) {
    auto tensor = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) std::memcpy(tensor.data_ptr(), bytes.data() + data_start + e.begin, e.end - e.begin);
    out.emplace_back(e.name, std::move(tensor));
  }
  return out;
}

void write_safetensors(const std::filesystem::path& file, const NamedTensors& tensors, Json metadata) {
  const std::string fname = file.string();
  if (!metadata.is_object()) throw ValueError(fname + ": safetensors metadata must be a JSON object");
  if (!metadata.contains("format")) metadata["format"] = "pt";
  Json header = Json::object();
  header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!names.insert(name).second) throw ValueError(fname + ": duplicate tensor name '" + name + "'");
    auto c = t.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = c.numel() * c.element_size();
    header[name] = {{"dtype", dtype_name(c.scalar_type(), fname + ": tensor '" + name + "'")},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    contiguous.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(fname + ": cannot open for writing");
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& c : contiguous) {
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
  }
  if (!out) throw Error(fname + ": write failed");
}

}  // namespace hyflow::models
