// A Parquet reader for the files verl's data preprocessing writes (hyflow/trainer/parquet.hpp).
// In reading order: the Thrift compact protocol of the footer and the page headers, the schema
// tree, page decompression and decoding (levels, PLAIN and dictionary values), and the record
// assembly that turns each leaf column's (repetition, definition, value) triples into the
// nested JSON of its rows (Dremel's algorithm, as in the Parquet format's documentation).
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/parquet.hpp>

#include <snappy.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace hyflow::trainer {

namespace {

using nlohmann::json;

/// Bounds of what a file may claim before anything is allocated for it.
constexpr int64_t kMaxPageBytes = int64_t{1} << 30;
constexpr int64_t kMaxPageValues = int64_t{1} << 28;
constexpr int kMaxThriftDepth = 64;

// ---- Thrift compact protocol ------------------------------------------------------------------

/// A decoded Thrift value: an integer (also bool and enum), a double, a binary, a list or a
/// struct (field id -> value). Enough to read parquet.thrift's structs by field id.
struct TValue {
  enum Kind { Int, Double, Binary, List, Struct } kind = Int;
  int64_t i = 0;
  double d = 0;
  std::string bin;
  std::vector<TValue> list;
  std::map<int16_t, TValue> fields;

  const TValue* field(int16_t id) const {
    auto it = fields.find(id);
    return it == fields.end() ? nullptr : &it->second;
  }
  int64_t integer(int16_t id, int64_t fallback) const {
    const TValue* f = field(id);
    return f && f->kind == Int ? f->i : fallback;
  }
  std::string text(int16_t id) const {
    const TValue* f = field(id);
    return f && f->kind == Binary ? f->bin : std::string();
  }
};

class ThriftReader {
 public:
  ThriftReader(const char* data, size_t size, std::string where)
      : p_(data), end_(data + size), where_(std::move(where)) {}

  TValue read_struct(int depth = 0) {
    if (depth > kMaxThriftDepth) fail("structs nested deeper than " + std::to_string(kMaxThriftDepth));
    TValue out;
    out.kind = TValue::Struct;
    int16_t last = 0;
    for (;;) {
      const uint8_t header = byte();
      const int type = header & 0x0f;
      if (type == 0) break;  // STOP
      const int delta = header >> 4;
      const int16_t id = delta ? static_cast<int16_t>(last + delta) : static_cast<int16_t>(zigzag(varint()));
      last = id;
      out.fields[id] = read_value(type, depth + 1);
    }
    return out;
  }
  size_t consumed(const char* start) const { return static_cast<size_t>(p_ - start); }

 private:
  TValue read_value(int type, int depth) {
    TValue v;
    switch (type) {
      case 1:
        v.i = 1;
        break;  // BOOLEAN_TRUE
      case 2:
        v.i = 0;
        break;  // BOOLEAN_FALSE
      case 3:
        v.i = static_cast<int8_t>(byte());
        break;
      case 4:
      case 5:
      case 6:
        v.i = zigzag(varint());
        break;
      case 7: {
        need(8);
        v.kind = TValue::Double;
        std::memcpy(&v.d, p_, 8);
        p_ += 8;
        break;
      }
      case 8: {
        const uint64_t n = varint();
        need(n);
        v.kind = TValue::Binary;
        v.bin.assign(p_, static_cast<size_t>(n));
        p_ += n;
        break;
      }
      case 9:
      case 10: {  // LIST, SET
        const uint8_t h = byte();
        uint64_t n = h >> 4;
        if (n == 15) n = varint();
        need(n);  // every element takes at least one byte
        v.kind = TValue::List;
        v.list.reserve(static_cast<size_t>(n));
        const int element = h & 0x0f;
        for (uint64_t k = 0; k < n; ++k) {
          if (element == 1 || element == 2) {  // a bool in a list is a whole byte
            TValue b;
            b.i = byte() == 1;
            v.list.push_back(std::move(b));
          } else {
            v.list.push_back(read_value(element, depth + 1));
          }
        }
        break;
      }
      case 11: {  // MAP: parquet.thrift has none in what is read; skipped
        const uint64_t n = varint();
        if (n == 0) break;
        need(n);
        const uint8_t kv = byte();
        for (uint64_t k = 0; k < n; ++k) {
          read_value(kv >> 4, depth + 1);
          read_value(kv & 0x0f, depth + 1);
        }
        break;
      }
      case 12:
        v = read_struct(depth);
        break;
      default:
        fail("unknown Thrift type " + std::to_string(type));
    }
    return v;
  }
  uint8_t byte() {
    need(1);
    return static_cast<uint8_t>(*p_++);
  }
  uint64_t varint() {
    uint64_t out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      out |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return out;
    }
    fail("a varint longer than 10 bytes");
  }
  static int64_t zigzag(uint64_t n) { return static_cast<int64_t>(n >> 1) ^ -static_cast<int64_t>(n & 1); }
  void need(uint64_t n) const {
    if (n > static_cast<uint64_t>(end_ - p_)) fail("Thrift data ends early");
  }
  [[noreturn]] void fail(const std::string& what) const { throw FormatError(where_ + ": " + what); }

  const char* p_;
  const char* end_;
  std::string where_;
};

// ---- schema -----------------------------------------------------------------------------------

enum Repetition { REQUIRED = 0, OPTIONAL = 1, REPEATED = 2 };
enum PhysicalType { BOOLEAN = 0, INT32 = 1, INT64 = 2, INT96 = 3, FLOAT = 4, DOUBLE = 5, BYTE_ARRAY = 6, FIXED = 7 };
const char* type_name(int t) {
  static const char* names[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  return t >= 0 && t < 8 ? names[t] : "unknown";
}

struct SchemaNode {
  std::string name;
  std::string path;  ///< dotted, for messages and for matching column chunks
  int repetition = REQUIRED;
  int type = -1;  ///< physical type of a leaf; -1 for a group
  bool list = false, map = false, decimal = false;
  std::vector<SchemaNode> children;
  bool leaf() const { return type >= 0; }
};

SchemaNode build_schema(const std::vector<TValue>& elements, size_t& next, const std::string& parent,
                        const std::string& where, int depth) {
  if (next >= elements.size()) throw FormatError(where + ": the schema has fewer elements than its groups claim");
  if (depth > kMaxThriftDepth) throw FormatError(where + ": a schema nested deeper than 64 levels");
  const TValue& e = elements[next++];
  SchemaNode n;
  n.name = e.text(4);
  n.path = parent.empty() ? n.name : parent + "." + n.name;
  n.repetition = static_cast<int>(e.integer(3, REQUIRED));
  const int64_t converted = e.integer(6, -1);
  const TValue* logical = e.field(10);
  n.list = converted == 3 || (logical && logical->field(3));
  n.map = converted == 1 || converted == 2 || (logical && logical->field(2));
  n.decimal = converted == 5 || (logical && logical->field(5));
  const int64_t children = e.integer(5, 0);
  if (children > 0) {
    if (children > static_cast<int64_t>(elements.size()))
      throw FormatError(where + ": schema group '" + n.path + "' claims " + std::to_string(children) + " children");
    for (int64_t c = 0; c < children; ++c)
      n.children.push_back(build_schema(elements, next, depth == 0 ? "" : n.path, where, depth + 1));
  } else {
    n.type = static_cast<int>(e.integer(1, -1));
    if (n.type < 0) throw FormatError(where + ": schema element '" + n.path + "' has neither a type nor children");
  }
  return n;
}

/// One node on the way from a top-level column to a leaf, with its levels and how its value
/// sits in its parent's (see assemble()).
struct Step {
  const SchemaNode* node;
  int def;                 ///< definition level when this node is present
  int rep;                 ///< repetition level of this node (counting repeated nodes down to it)
  bool same_slot = false;  ///< the child's value is this node's value (a list's wrapper, a list element)
};

std::vector<std::vector<Step>> leaf_paths(const SchemaNode& column, const std::string& where) {
  std::vector<std::vector<Step>> out;
  std::vector<Step> path;
  auto walk = [&](auto& self, const SchemaNode& n, const SchemaNode* parent) -> void {
    if (n.map) throw FormatError(where + ", column '" + n.path + "': MAP columns are not supported");
    if (n.leaf() && n.decimal) throw FormatError(where + ", column '" + n.path + "': DECIMAL values are not supported");
    if (n.leaf() && (n.type == INT96 || n.type == FIXED || n.type > FIXED))
      throw FormatError(where + ", column '" + n.path + "': " + type_name(n.type) + " values are not supported");
    Step s{&n, path.empty() ? 0 : path.back().def, path.empty() ? 0 : path.back().rep};
    if (n.repetition != REQUIRED) ++s.def;
    if (n.repetition == REPEATED) ++s.rep;
    if (n.list && !n.leaf()) {
      if (n.children.size() != 1 || n.children[0].repetition != REPEATED)
        throw FormatError(where + ", column '" + n.path + "': a LIST group must hold one repeated field");
      s.same_slot = true;
    }
    // A repeated group under a LIST whose single field is the element (the standard three-level
    // list, "list"/"element"); "array" and "*_tuple" are the legacy names of a struct element.
    if (parent && parent->list && n.repetition == REPEATED && !n.leaf() && n.children.size() == 1 &&
        n.name != "array" && !(n.name.size() > 6 && n.name.compare(n.name.size() - 6, 6, "_tuple") == 0))
      s.same_slot = true;
    path.push_back(s);
    if (n.leaf()) out.push_back(path);
    for (const auto& c : n.children) self(self, c, &n);
    path.pop_back();
  };
  walk(walk, column, nullptr);
  return out;
}

// ---- pages ------------------------------------------------------------------------------------

int bit_width(int64_t max) {
  int w = 0;
  while (max > 0) {
    ++w;
    max >>= 1;
  }
  return w;
}

/// A byte range being decoded, with the message context of its column.
struct Bytes {
  const uint8_t* p;
  const uint8_t* end;
  const std::string* where;
  [[noreturn]] void fail(const std::string& what) const { throw FormatError(*where + ": " + what); }
  size_t left() const { return static_cast<size_t>(end - p); }
  void need(size_t n) const {
    if (n > left()) fail("page data ends early");
  }
  uint64_t uleb() {
    uint64_t out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const uint8_t b = *p++;
      out |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return out;
    }
    fail("a varint longer than 10 bytes");
  }
  uint32_t le32() {
    need(4);
    uint32_t v = 0;
    std::memcpy(&v, p, 4);
    p += 4;
    return v;
  }
};

/// The RLE / bit-packing hybrid of levels and dictionary indices: `count` values of `width` bits.
std::vector<uint32_t> decode_hybrid(Bytes in, int width, size_t count) {
  std::vector<uint32_t> out;
  out.reserve(count);
  if (width > 32) in.fail("a bit width of " + std::to_string(width));
  const size_t value_bytes = static_cast<size_t>((width + 7) / 8);
  while (out.size() < count) {
    const uint64_t header = in.uleb();
    if (header & 1) {  // bit-packed groups of 8 values, least significant bit first
      const uint64_t groups = header >> 1;
      const uint64_t bytes = groups * static_cast<uint64_t>(width);
      if (width > 0 && (groups > in.left() || bytes > in.left())) in.fail("a bit-packed run longer than its page");
      const uint64_t values = groups * 8;
      for (uint64_t k = 0; k < values && out.size() < count; ++k) {
        uint64_t v = 0;
        for (int b = 0; b < width; ++b) {
          const uint64_t bit = k * static_cast<uint64_t>(width) + static_cast<uint64_t>(b);
          v |= static_cast<uint64_t>((in.p[bit / 8] >> (bit % 8)) & 1) << b;
        }
        out.push_back(static_cast<uint32_t>(v));
      }
      in.p += bytes;
    } else {  // a run of one value
      const uint64_t run = header >> 1;
      in.need(value_bytes);
      uint32_t v = 0;
      for (size_t b = 0; b < value_bytes; ++b) v |= static_cast<uint32_t>(in.p[b]) << (8 * b);
      in.p += value_bytes;
      if (run == 0) in.fail("an empty RLE run");
      for (uint64_t k = 0; k < run && out.size() < count; ++k) out.push_back(v);
    }
  }
  return out;
}

/// `count` PLAIN values of a leaf's physical type, converted to JSON.
void decode_plain(Bytes in, int type, size_t count, std::vector<json>& out) {
  out.reserve(out.size() + count);
  switch (type) {
    case BOOLEAN:
      in.need((count + 7) / 8);
      for (size_t k = 0; k < count; ++k) out.emplace_back(((in.p[k / 8] >> (k % 8)) & 1) != 0);
      return;
    case INT32:
    case FLOAT:
      in.need(4 * count);
      for (size_t k = 0; k < count; ++k, in.p += 4) {
        if (type == INT32) {
          int32_t v;
          std::memcpy(&v, in.p, 4);
          out.emplace_back(v);
        } else {
          float v;
          std::memcpy(&v, in.p, 4);
          out.emplace_back(static_cast<double>(v));
        }
      }
      return;
    case INT64:
    case DOUBLE:
      in.need(8 * count);
      for (size_t k = 0; k < count; ++k, in.p += 8) {
        if (type == INT64) {
          int64_t v;
          std::memcpy(&v, in.p, 8);
          out.emplace_back(v);
        } else {
          double v;
          std::memcpy(&v, in.p, 8);
          out.emplace_back(v);
        }
      }
      return;
    case BYTE_ARRAY:
      for (size_t k = 0; k < count; ++k) {
        const uint32_t n = in.le32();
        in.need(n);
        out.emplace_back(std::string(reinterpret_cast<const char*>(in.p), n));
        in.p += n;
      }
      return;
    default:
      in.fail(std::string(type_name(type)) + " values are not supported");
  }
}

enum Codec { UNCOMPRESSED = 0, SNAPPY = 1, GZIP = 2, ZSTD = 6 };

std::string decompress(int codec, const char* data, size_t size, int64_t expected, const std::string& where) {
  if (expected < 0 || expected > kMaxPageBytes)
    throw FormatError(where + ": a page claims " + std::to_string(expected) + " uncompressed bytes");
  const auto n = static_cast<size_t>(expected);
  std::string out;
  switch (codec) {
    case UNCOMPRESSED:
      if (size != n)
        throw FormatError(where + ": an uncompressed page of " + std::to_string(size) + " bytes claims " +
                          std::to_string(n));
      return std::string(data, size);
    case SNAPPY: {
      size_t length = 0;
      if (!snappy::GetUncompressedLength(data, size, &length) || length != n || !snappy::Uncompress(data, size, &out))
        throw FormatError(where + ": a SNAPPY page does not decompress to its " + std::to_string(n) + " bytes");
      return out;
    }
    case GZIP: {
      out.resize(n);
      z_stream z{};
      if (inflateInit2(&z, 15 + 32) != Z_OK) throw FormatError(where + ": zlib cannot start");
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
      z.avail_in = static_cast<uInt>(size);
      z.next_out = reinterpret_cast<Bytef*>(out.data());
      z.avail_out = static_cast<uInt>(n);
      const int rc = inflate(&z, Z_FINISH);
      const bool whole = rc == Z_STREAM_END && z.total_out == n;
      inflateEnd(&z);
      if (!whole) throw FormatError(where + ": a GZIP page does not decompress to its " + std::to_string(n) + " bytes");
      return out;
    }
    case ZSTD: {
      out.resize(n);
      const size_t rc = ZSTD_decompress(out.data(), n, data, size);
      if (ZSTD_isError(rc) || rc != n)
        throw FormatError(where + ": a ZSTD page does not decompress to its " + std::to_string(n) + " bytes" +
                          (ZSTD_isError(rc) ? std::string(" (") + ZSTD_getErrorName(rc) + ")" : std::string()));
      return out;
    }
    default: {
      static const char* names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
      throw FormatError(where + ": " + (codec >= 0 && codec < 8 ? names[codec] : "unknown") +
                        " compression is not supported (SNAPPY, GZIP, ZSTD or none)");
    }
  }
}

enum Encoding { PLAIN = 0, PLAIN_DICTIONARY = 2, RLE = 3, RLE_DICTIONARY = 8 };

/// One leaf column chunk decoded: a level pair per value and the present values in order.
struct LeafData {
  std::vector<uint32_t> rep, def;
  std::vector<json> values;
};

LeafData read_chunk(const std::string& file, const TValue& meta, const SchemaNode& leaf, int max_rep, int max_def,
                    const std::string& where) {
  const int codec = static_cast<int>(meta.integer(4, 0));
  const int64_t num_values = meta.integer(5, 0);
  const int64_t data_offset = meta.integer(9, -1);
  const int64_t dict_offset = meta.integer(11, 0);
  const int64_t total = meta.integer(7, -1);
  int64_t start = data_offset;
  if (dict_offset > 0 && dict_offset < start) start = dict_offset;
  const auto size = static_cast<int64_t>(file.size());
  if (start < 4 || total < 0 || start > size || total > size - start || num_values < 0)
    throw FormatError(where + ": the column chunk lies outside the file");
  LeafData out;
  std::vector<json> dictionary;
  int64_t pos = start;
  const int64_t end = start + total;
  while (static_cast<int64_t>(out.def.size()) < num_values) {
    if (pos >= end)
      throw FormatError(where + ": the column chunk ends before its " + std::to_string(num_values) + " values");
    ThriftReader header_reader(file.data() + pos, static_cast<size_t>(end - pos), where + " (page header)");
    const TValue header = header_reader.read_struct();
    pos += static_cast<int64_t>(header_reader.consumed(file.data() + pos));
    const int page_type = static_cast<int>(header.integer(1, -1));
    const int64_t uncompressed = header.integer(2, -1);
    const int64_t compressed = header.integer(3, -1);
    if (compressed < 0 || compressed > end - pos) throw FormatError(where + ": a page runs past its column chunk");
    const char* body = file.data() + pos;
    pos += compressed;
    if (page_type == 2) {  // DICTIONARY_PAGE
      const TValue* d = header.field(7);
      if (!d) throw FormatError(where + ": a dictionary page without its header");
      const int encoding = static_cast<int>(d->integer(2, PLAIN));
      if (encoding != PLAIN && encoding != PLAIN_DICTIONARY)
        throw FormatError(where + ": a dictionary page of encoding " + std::to_string(encoding));
      const std::string page = decompress(codec, body, static_cast<size_t>(compressed), uncompressed, where);
      const int64_t n = d->integer(1, 0);
      if (n < 0 || n > static_cast<int64_t>(page.size()) * 8 + 8)
        throw FormatError(where + ": a dictionary of " + std::to_string(n) + " values");
      dictionary.clear();
      Bytes in{reinterpret_cast<const uint8_t*>(page.data()),
               reinterpret_cast<const uint8_t*>(page.data() + page.size()), &where};
      decode_plain(in, leaf.type, static_cast<size_t>(n), dictionary);
      continue;
    }
    if (page_type != 0 && page_type != 3) continue;  // an index page: nothing to read
    const bool v2 = page_type == 3;
    const TValue* h = header.field(v2 ? 8 : 5);
    if (!h) throw FormatError(where + ": a data page without its header");
    const int64_t n = h->integer(1, -1);
    if (n < 0 || n > kMaxPageValues || n > num_values - static_cast<int64_t>(out.def.size()))
      throw FormatError(where + ": a data page of " + std::to_string(n) + " values, more than the chunk holds");
    const int encoding = static_cast<int>(h->integer(v2 ? 4 : 2, PLAIN));
    std::string page;  // the levels and values, decompressed
    size_t levels_end = 0;
    std::vector<uint32_t> rep, def;
    if (v2) {
      const int64_t def_len = h->integer(5, 0), rep_len = h->integer(6, 0);
      if (def_len < 0 || rep_len < 0 || def_len + rep_len > compressed || def_len + rep_len > uncompressed)
        throw FormatError(where + ": data page v2 levels longer than the page");
      const bool compressed_values = h->integer(7, 1) != 0;
      const auto levels = static_cast<size_t>(rep_len + def_len);
      page.assign(body, levels);
      page += compressed_values ? decompress(codec, body + levels, static_cast<size_t>(compressed) - levels,
                                             uncompressed - static_cast<int64_t>(levels), where)
                                : std::string(body + levels, static_cast<size_t>(compressed) - levels);
      const auto* base = reinterpret_cast<const uint8_t*>(page.data());
      if (max_rep > 0)
        rep = decode_hybrid(Bytes{base, base + rep_len, &where}, bit_width(max_rep), static_cast<size_t>(n));
      if (max_def > 0)
        def = decode_hybrid(Bytes{base + rep_len, base + rep_len + def_len, &where}, bit_width(max_def),
                            static_cast<size_t>(n));
      levels_end = levels;
    } else {
      page = decompress(codec, body, static_cast<size_t>(compressed), uncompressed, where);
      Bytes in{reinterpret_cast<const uint8_t*>(page.data()),
               reinterpret_cast<const uint8_t*>(page.data() + page.size()), &where};
      for (int which = 0; which < 2; ++which) {
        const int max = which == 0 ? max_rep : max_def;
        if (max == 0) continue;
        const int level_encoding = static_cast<int>(h->integer(which == 0 ? 4 : 3, RLE));
        if (level_encoding != RLE)
          throw FormatError(where + ": levels of encoding " + std::to_string(level_encoding) + " (only RLE)");
        const uint32_t len = in.le32();
        in.need(len);
        (which == 0 ? rep : def) =
            decode_hybrid(Bytes{in.p, in.p + len, &where}, bit_width(max), static_cast<size_t>(n));
        in.p += len;
      }
      levels_end = static_cast<size_t>(in.p - reinterpret_cast<const uint8_t*>(page.data()));
    }
    if (rep.empty()) rep.assign(static_cast<size_t>(n), 0);
    if (def.empty()) def.assign(static_cast<size_t>(n), static_cast<uint32_t>(max_def));
    size_t present = 0;
    for (uint32_t d : def) present += d == static_cast<uint32_t>(max_def);
    Bytes values{reinterpret_cast<const uint8_t*>(page.data()) + levels_end,
                 reinterpret_cast<const uint8_t*>(page.data() + page.size()), &where};
    if (encoding == PLAIN) {
      decode_plain(values, leaf.type, present, out.values);
    } else if (encoding == PLAIN_DICTIONARY || encoding == RLE_DICTIONARY) {
      if (present > 0) {
        values.need(1);
        const int width = *values.p++;
        for (uint32_t k : decode_hybrid(values, width, present)) {
          if (k >= dictionary.size())
            throw FormatError(where + ": dictionary index " + std::to_string(k) + " of a dictionary of " +
                              std::to_string(dictionary.size()));
          out.values.push_back(dictionary[k]);
        }
      }
    } else {
      static const char* names[] = {
          "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
          "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
          "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
      throw FormatError(where + ": " + (encoding >= 0 && encoding < 10 ? names[encoding] : "unknown") +
                        " encoding is not supported (PLAIN and dictionary encodings are)");
    }
    out.rep.insert(out.rep.end(), rep.begin(), rep.end());
    out.def.insert(out.def.end(), def.begin(), def.end());
  }
  return out;
}

// ---- record assembly --------------------------------------------------------------------------

/// Puts one leaf column's triples into the rows. Each (r, d) pair walks the leaf's path from the
/// top-level column: a node absent at level d leaves null (an empty array for a repeated one);
/// a repeated node continues its current element when r is deeper than it, starts the next
/// element at r equal to its own level, and its first element when its parent is new. The
/// element counters make the walk of a second leaf meet the containers the first one made.
void assemble(std::vector<json>& rows, const std::vector<Step>& path, const LeafData& data, const std::string& where) {
  std::vector<size_t> element(static_cast<size_t>(path.back().rep) + 1, 0);
  int64_t row = -1;
  size_t next_value = 0;
  const int max_def = path.back().def;
  for (size_t t = 0; t < data.def.size(); ++t) {
    const int r = static_cast<int>(data.rep[t]), d = static_cast<int>(data.def[t]);
    if (r > path.back().rep || d > max_def) throw FormatError(where + ": a level above the column's maximum");
    if (r == 0) ++row;
    if (row < 0 || row >= static_cast<int64_t>(rows.size()))
      throw FormatError(where + ": more rows than its row group's " + std::to_string(rows.size()));
    json* slot = &rows[static_cast<size_t>(row)][path.front().node->name];
    for (size_t i = 0; i < path.size(); ++i) {
      const Step& s = path[i];
      const SchemaNode& n = *s.node;
      if (n.repetition == OPTIONAL && d < s.def) break;  // null here
      if (n.repetition == REPEATED) {
        if (slot->is_null()) *slot = json::array();
        if (d < s.def) break;  // an empty list
        size_t& k = element[static_cast<size_t>(s.rep)];
        if (s.rep == r && r > 0)
          ++k;
        else if (s.rep > r)
          k = 0;
        while (slot->size() <= k) slot->push_back(nullptr);
        slot = &(*slot)[k];
      }
      if (n.leaf()) {
        if (next_value >= data.values.size()) throw FormatError(where + ": fewer values than definition levels");
        *slot = data.values[next_value++];
        break;
      }
      if (s.same_slot) continue;
      if (slot->is_null()) *slot = json::object();
      slot = &(*slot)[path[i + 1].node->name];
    }
  }
  if (row + 1 != static_cast<int64_t>(rows.size()))
    throw FormatError(where + ": " + std::to_string(row + 1) + " rows, its row group has " +
                      std::to_string(rows.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError("cannot open dataset file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw FormatError("dataset file '" + path + "': read error");
  return ss.str();
}

}  // namespace

bool is_parquet_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "PAR1", 4) == 0;
}

std::vector<json> read_parquet(const std::string& path, const std::vector<std::string>& columns) {
  const std::string file = read_file(path);
  const std::string where = "parquet file '" + path + "'";
  if (file.size() < 12 || file.compare(0, 4, "PAR1") != 0 || file.compare(file.size() - 4, 4, "PAR1") != 0)
    throw FormatError(where + ": not a Parquet file (no PAR1 magic at both ends)");
  uint32_t footer = 0;
  std::memcpy(&footer, file.data() + file.size() - 8, 4);
  if (footer > file.size() - 12) throw FormatError(where + ": a footer of " + std::to_string(footer) + " bytes");
  const char* footer_start = file.data() + file.size() - 8 - footer;
  const TValue meta = ThriftReader(footer_start, footer, where + " (footer)").read_struct();
  const TValue* elements = meta.field(2);
  if (!elements || elements->kind != TValue::List || elements->list.empty())
    throw FormatError(where + ": the footer has no schema");
  size_t next = 0;
  const SchemaNode root = build_schema(elements->list, next, "", where, 0);

  std::vector<const SchemaNode*> selected;
  for (const auto& c : root.children)
    if (columns.empty() || std::find(columns.begin(), columns.end(), c.name) != columns.end()) selected.push_back(&c);
  std::map<std::string, std::vector<std::vector<Step>>> paths;  // top-level column -> its leaves
  for (const auto* c : selected) paths[c->name] = leaf_paths(*c, where);

  std::vector<json> rows;
  const TValue* groups = meta.field(4);
  if (!groups || groups->kind != TValue::List) return rows;
  for (const TValue& group : groups->list) {
    const int64_t n = group.integer(3, -1);
    if (n < 0 || n > static_cast<int64_t>(file.size()))
      throw FormatError(where + ": a row group of " + std::to_string(n) + " rows");
    std::vector<json> part(static_cast<size_t>(n), json::object());
    std::map<std::string, const TValue*> chunks;  // dotted path -> column metadata
    if (const TValue* cc = group.field(1); cc && cc->kind == TValue::List)
      for (const TValue& chunk : cc->list)
        if (const TValue* cm = chunk.field(3)) {
          std::string dotted;
          if (const TValue* p = cm->field(3); p && p->kind == TValue::List)
            for (const TValue& part_name : p->list) dotted += (dotted.empty() ? "" : ".") + part_name.bin;
          chunks[dotted] = cm;
        }
    for (const auto* c : selected)
      for (const auto& leaf_path : paths[c->name]) {
        const SchemaNode& leaf = *leaf_path.back().node;
        const std::string col_where = where + ", column '" + leaf.path + "'";
        auto it = chunks.find(leaf.path);
        if (it == chunks.end()) throw FormatError(col_where + ": no column chunk in a row group");
        const LeafData data =
            read_chunk(file, *it->second, leaf, leaf_path.back().rep, leaf_path.back().def, col_where);
        assemble(part, leaf_path, data, col_where);
      }
    rows.insert(rows.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return rows;
}

}  // namespace hyflow::trainer
