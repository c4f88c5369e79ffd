// The DataProto wire format, version 1 (specified in docs/dataproto-format.md).
//
//   magic "HYDP" | u16 version | u16 flags(0) | i64 batch_size (-1: no tensor batch)
//   u32 n_tensors, then per tensor:
//       u32 name_len | name | u8 dtype | u8 ndim | i64 dims[ndim] | u64 nbytes |
//       zero padding up to the next multiple of 16 from the start | raw bytes
//   u32 n_columns, then per column: u32 name_len | name | u64 len | CBOR array
//   u64 len | CBOR object (meta_info)
//
// All integers little-endian. Every length is checked against the remaining input before
// anything is allocated.
#include <hyflow/dataproto/serialization.hpp>

#include <ATen/ATen.h>
#include <cereal/archives/binary.hpp>

#include <array>
#include <bit>
#include <cstring>
#include <fstream>
#include <streambuf>

static_assert(std::endian::native == std::endian::little,
              "the DataProto wire format stores raw little-endian tensors; big-endian hosts need byte swapping");

namespace hyflow::dataproto {
namespace {

// --- dtype codes (part of the format: never renumber) ------------------------------------
struct DtypeCode {
  uint8_t code;
  at::ScalarType type;
};
constexpr std::array<DtypeCode, 12> kDtypes{{
    {1, at::kFloat}, {2, at::kDouble}, {3, at::kHalf}, {4, at::kBFloat16}, {5, at::kChar}, {6, at::kShort},
    {7, at::kInt}, {8, at::kLong}, {9, at::kByte}, {10, at::kBool}, {11, at::kComplexFloat}, {12, at::kComplexDouble},
}};

uint8_t dtype_code(at::ScalarType t, const std::string& key) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.code;
  throw ValueError("serialize: tensor '" + key + "' has dtype " + std::string(c10::toString(t)) +
                   " which the wire format does not carry");
}

constexpr size_t kMaxNameLength = 1 << 16;
constexpr uint8_t kMaxDims = 64;
constexpr size_t kMaxJsonDepth = 256;
/// Raw tensor bytes start at a multiple of this offset, so an aligned buffer can be aliased.
constexpr size_t kPayloadAlignment = 16;

size_t padding_for(size_t position) { return (kPayloadAlignment - position % kPayloadAlignment) % kPayloadAlignment; }

// --- streams over memory --------------------------------------------------------------------
/// Appends to a vector<char>; cereal writes through sputn, so this is one memcpy per field.
class VectorSink : public std::streambuf {
 public:
  explicit VectorSink(std::vector<char>& out) : out_(out) {}

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    out_.insert(out_.end(), s, s + n);
    return n;
  }
  int_type overflow(int_type c) override {
    if (c != traits_type::eof()) out_.push_back(static_cast<char>(c));
    return c;
  }

 private:
  std::vector<char>& out_;
};

/// Reads from a span and knows how much is left, so lengths can be checked before allocating.
class SpanSource : public std::streambuf {
 public:
  explicit SpanSource(std::span<const char> in) : in_(in) {}
  size_t position() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }
  std::span<const char> take(size_t n) {
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

 protected:
  std::streamsize xsgetn(char* s, std::streamsize n) override {
    const size_t k = std::min(static_cast<size_t>(n), remaining());
    std::memcpy(s, in_.data() + pos_, k);
    pos_ += k;
    return static_cast<std::streamsize>(k);
  }
  int_type underflow() override {
    return pos_ < in_.size() ? traits_type::to_int_type(in_[pos_]) : traits_type::eof();
  }
  int_type uflow() override {
    return pos_ < in_.size() ? traits_type::to_int_type(in_[pos_++]) : traits_type::eof();
  }

 private:
  std::span<const char> in_;
  size_t pos_ = 0;
};

// --- CBOR with a nesting limit (nlohmann's CBOR reader recurses per level) ----------------
class DepthLimitedSax {
 public:
  explicit DepthLimitedSax(Json& result) : dom_(result, true) {}
  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(Json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& s) { return dom_.number_float(v, s); }
  bool string(Json::string_t& v) { return dom_.string(v); }
  bool binary(Json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) { return enter() && dom_.start_object(n); }
  bool key(Json::string_t& v) { return dom_.key(v); }
  bool end_object() { return leave() && dom_.end_object(); }
  bool start_array(std::size_t n) { return enter() && dom_.start_array(n); }
  bool end_array() { return leave() && dom_.end_array(); }
  bool parse_error(std::size_t pos, const std::string& token, const nlohmann::detail::exception& e) {
    return dom_.parse_error(pos, token, e);
  }
  bool too_deep() const { return too_deep_; }

 private:
  bool enter() {
    if (++depth_ > kMaxJsonDepth) too_deep_ = true;
    return !too_deep_;
  }
  bool leave() {
    --depth_;
    return true;
  }
  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  size_t depth_ = 0;
  bool too_deep_ = false;
};

class Decoder {
 public:
  /// With an owner, tensors alias the owner's bytes instead of copying them.
  Decoder(std::span<const char> bytes, std::shared_ptr<const std::vector<char>> owner)
      : source_(bytes), stream_(&source_), archive_(stream_), owner_(std::move(owner)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError("DataProto decode: " + what + " at byte offset " + std::to_string(source_.position()));
  }

  template <class T>
  T read(const char* what) {
    if (source_.remaining() < sizeof(T))
      fail(std::string("truncated input reading ") + what + " (" + std::to_string(sizeof(T)) + " bytes needed, " +
           std::to_string(source_.remaining()) + " left)");
    T v{};
    archive_(v);
    return v;
  }

  void require(uint64_t n, const std::string& what) const {
    if (n > source_.remaining())
      fail(what + " declares " + std::to_string(n) + " bytes but only " + std::to_string(source_.remaining()) +
           " remain");
  }

  std::string read_name(const char* what) {
    const auto len = read<uint32_t>(what);
    if (len > kMaxNameLength) fail(std::string(what) + " of " + std::to_string(len) + " bytes is too long");
    require(len, what);
    std::string s(len, '\0');
    archive_(cereal::binary_data(s.data(), len));
    return s;
  }

  Json read_cbor(const std::string& what) {
    const auto len = read<uint64_t>(what.c_str());
    require(len, what);
    const size_t at = source_.position();
    auto bytes = source_.take(static_cast<size_t>(len));
    Json value;
    DepthLimitedSax sax(value);
    try {
      const auto* first = reinterpret_cast<const uint8_t*>(bytes.data());
      Json::sax_parse(first, first + bytes.size(), &sax, Json::input_format_t::cbor, true);
    } catch (const Json::exception& e) {
      throw FormatError("DataProto decode: " + what + " is not valid CBOR (" + e.what() + ") at byte offset " +
                        std::to_string(at));
    }
    if (sax.too_deep())
      throw FormatError("DataProto decode: " + what + " nests deeper than " + std::to_string(kMaxJsonDepth) +
                        " levels at byte offset " + std::to_string(at));
    return value;
  }

  at::Tensor read_tensor(const std::string& key, int64_t batch_size) {
    const auto code = read<uint8_t>("dtype");
    const DtypeCode* dtype = nullptr;
    for (const auto& d : kDtypes)
      if (d.code == code) dtype = &d;
    if (!dtype) fail("tensor '" + key + "' has unknown dtype code " + std::to_string(code));
    const auto ndim = read<uint8_t>("ndim");
    if (ndim == 0 || ndim > kMaxDims) fail("tensor '" + key + "' has " + std::to_string(ndim) + " dimensions");
    std::vector<int64_t> dims(ndim);
    uint64_t numel = 1;
    for (auto& d : dims) {
      d = read<int64_t>("dimension");
      if (d < 0) fail("tensor '" + key + "' has negative dimension " + std::to_string(d));
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) fail("tensor '" + key + "' is too large");
    }
    if (dims[0] != batch_size)
      fail("tensor '" + key + "' has " + std::to_string(dims[0]) + " rows but the batch has " +
           std::to_string(batch_size));
    const auto nbytes = read<uint64_t>("tensor byte count");
    uint64_t expected = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(c10::elementSize(dtype->type)), &expected) ||
        nbytes != expected)
      fail("tensor '" + key + "' declares " + std::to_string(nbytes) + " bytes for " + std::to_string(numel) +
           " elements of " + c10::toString(dtype->type));
    const size_t pad = padding_for(source_.position());
    require(pad, "alignment padding");
    for (char c : source_.take(pad))
      if (c != 0) fail("non-zero alignment padding before tensor '" + key + "'");
    require(nbytes, "tensor '" + key + "'");
    const auto options = at::TensorOptions().dtype(dtype->type);
    auto payload = source_.take(static_cast<size_t>(nbytes));
    const auto address = reinterpret_cast<uintptr_t>(payload.data());
    if (owner_ && nbytes && address % c10::elementSize(dtype->type) == 0) {
      auto keep_alive = owner_;  // the tensor holds the buffer until it dies
      return at::from_blob(const_cast<char*>(payload.data()), dims, [keep_alive](void*) {}, options);
    }
    at::Tensor t = at::empty(dims, options);
    if (nbytes) std::memcpy(t.data_ptr(), payload.data(), payload.size());
    return t;
  }

  DataProto decode() {
    char magic[4];
    if (source_.remaining() < sizeof magic) fail("truncated header");
    archive_(cereal::binary_data(magic, sizeof magic));
    if (std::memcmp(magic, kWireMagic, sizeof magic) != 0) fail("bad magic (not a DataProto encoding)");
    const auto version = read<uint16_t>("version");
    if (version != kWireVersion)
      fail("unsupported format version " + std::to_string(version) + " (this build reads version " +
           std::to_string(kWireVersion) + ")");
    const auto flags = read<uint16_t>("flags");
    if (flags != 0) fail("unknown flags " + std::to_string(flags));
    const auto batch_size = read<int64_t>("batch size");
    if (batch_size < -1) fail("negative batch size " + std::to_string(batch_size));

    DataProto out;
    const auto n_tensors = read<uint32_t>("tensor count");
    if (n_tensors > 0 && batch_size < 0) fail("tensors present but no batch size");
    if (n_tensors > source_.remaining() / 14) fail(std::to_string(n_tensors) + " tensors cannot fit in the input");
    out.batch = batch_size >= 0 ? TensorDict::with_batch_size(batch_size) : TensorDict();
    for (uint32_t i = 0; i < n_tensors; ++i) {
      std::string key = read_name("tensor name");
      if (out.batch.contains(key)) fail("duplicate tensor '" + key + "'");
      out.batch.set(key, read_tensor(key, batch_size));
    }

    const auto n_columns = read<uint32_t>("column count");
    if (n_columns > source_.remaining() / 12) fail(std::to_string(n_columns) + " columns cannot fit in the input");
    for (uint32_t i = 0; i < n_columns; ++i) {
      std::string key = read_name("column name");
      if (out.non_tensor_batch.find(key) != out.non_tensor_batch.end()) fail("duplicate column '" + key + "'");
      Json values = read_cbor("column '" + key + "'");
      if (!values.is_array()) fail("column '" + key + "' is not an array");
      out.non_tensor_batch[key] = values.get<Column>();
    }
    out.meta_info = read_cbor("meta_info");
    if (!out.meta_info.is_object()) fail("meta_info is not an object");
    if (source_.remaining() != 0) fail(std::to_string(source_.remaining()) + " trailing bytes");
    try {
      out.check_consistency();
    } catch (const Error& e) {
      throw FormatError(std::string("DataProto decode: inconsistent batch: ") + e.what());
    }
    return out;
  }

 private:
  SpanSource source_;
  std::istream stream_;
  cereal::BinaryInputArchive archive_;
  std::shared_ptr<const std::vector<char>> owner_;
};

struct EncodedJson {
  std::string name;
  std::vector<uint8_t> cbor;
};

std::vector<EncodedJson> encode_columns(const DataProto& data) {
  std::vector<EncodedJson> out;
  for (const auto& [k, col] : data.non_tensor_batch) {
    Json array(Json::value_t::array);
    array.get_ref<Json::array_t&>() = col;
    out.push_back({k, Json::to_cbor(array)});
  }
  return out;
}

std::vector<at::Tensor> cpu_contiguous(const DataProto& data) {
  std::vector<at::Tensor> out;
  for (const auto& [k, t] : data.batch) {
    dtype_code(t.scalar_type(), k);
    out.push_back(t.to(at::kCPU).contiguous());
  }
  return out;
}

size_t encoded_size(const DataProto& data, const std::vector<at::Tensor>& tensors,
                    const std::vector<EncodedJson>& columns, const std::vector<uint8_t>& meta) {
  size_t n = 4 + 2 + 2 + 8 + 4;
  size_t i = 0;
  for (const auto& [k, t] : data.batch) {
    n += 4 + k.size() + 1 + 1 + 8 * static_cast<size_t>(t.dim()) + 8;
    n += padding_for(n) + tensors[i++].nbytes();
  }
  n += 4;
  for (const auto& c : columns) n += 4 + c.name.size() + 8 + c.cbor.size();
  return n + 8 + meta.size();
}

}  // namespace

size_t serialized_size(const DataProto& data) {
  std::vector<at::Tensor> tensors;
  for (const auto& [k, t] : data.batch) tensors.push_back(t);  // sizes only: no copy needed
  return encoded_size(data, tensors, encode_columns(data), Json::to_cbor(data.meta_info));
}

void serialize_into(const DataProto& data, std::vector<char>& out) {
  data.check_consistency();
  const std::vector<at::Tensor> tensors = cpu_contiguous(data);
  const std::vector<EncodedJson> columns = encode_columns(data);
  const std::vector<uint8_t> meta = Json::to_cbor(data.meta_info);
  out.clear();
  out.reserve(encoded_size(data, tensors, columns, meta));

  VectorSink sink(out);
  std::ostream stream(&sink);
  cereal::BinaryOutputArchive ar(stream);
  ar(cereal::binary_data(kWireMagic, sizeof kWireMagic), kWireVersion, uint16_t{0});
  const auto batch_size = data.batch.batch_size();
  ar(static_cast<int64_t>(batch_size ? *batch_size : -1), static_cast<uint32_t>(data.batch.size()));
  size_t i = 0;
  for (const auto& [k, t0] : data.batch) {
    const at::Tensor& t = tensors[i++];
    ar(static_cast<uint32_t>(k.size()), cereal::binary_data(k.data(), k.size()));
    ar(dtype_code(t.scalar_type(), k), static_cast<uint8_t>(t.dim()));
    for (int64_t d : t.sizes()) ar(d);
    ar(static_cast<uint64_t>(t.nbytes()));
    static constexpr char zeros[kPayloadAlignment] = {};
    ar(cereal::binary_data(zeros, padding_for(out.size())));
    if (t.nbytes()) ar(cereal::binary_data(t.data_ptr(), t.nbytes()));
  }
  ar(static_cast<uint32_t>(columns.size()));
  for (const auto& c : columns) {
    ar(static_cast<uint32_t>(c.name.size()), cereal::binary_data(c.name.data(), c.name.size()));
    ar(static_cast<uint64_t>(c.cbor.size()), cereal::binary_data(c.cbor.data(), c.cbor.size()));
  }
  ar(static_cast<uint64_t>(meta.size()), cereal::binary_data(meta.data(), meta.size()));
}

std::vector<char> serialize(const DataProto& data) {
  std::vector<char> out;
  serialize_into(data, out);
  return out;
}

DataProto deserialize(std::span<const char> bytes) {
  try {
    return Decoder(bytes, nullptr).decode();
  } catch (const cereal::Exception& e) {
    throw FormatError(std::string("DataProto decode: truncated input (") + e.what() + ")");
  }
}

DataProto deserialize_owned(std::vector<char> bytes) {
  auto owner = std::make_shared<const std::vector<char>>(std::move(bytes));
  try {
    return Decoder(*owner, owner).decode();
  } catch (const cereal::Exception& e) {
    throw FormatError(std::string("DataProto decode: truncated input (") + e.what() + ")");
  }
}

void save_to_file(const DataProto& data, const std::filesystem::path& path) {
  const std::vector<char> bytes = serialize(data);
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error("save_to_file: cannot open " + tmp.string() + " for writing");
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) throw Error("save_to_file: writing " + tmp.string() + " failed");
  }
  std::filesystem::rename(tmp, path);
}

DataProto load_from_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("load_from_file: cannot open " + path.string());
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    return deserialize(bytes);
  } catch (const FormatError& e) {
    throw FormatError(path.string() + ": " + e.what());
  }
}

}  // namespace hyflow::dataproto
