#pragma once
// CAF 0.17 serialization hook: lets a DataProto travel inside a CAF message between
// processes, encoded in the versioned wire format (serialization.hpp). Register it on every
// node with `cfg.add_message_type<hyflow::DataProto>("hyflow::DataProto")`. Between actors of
// one process CAF passes the message by reference: no bytes are encoded, no tensor is copied.
//
// Only translation units that put DataProto into CAF messages include this header; the rest
// of hyflow::dataproto stays CAF-free.

#include <hyflow/dataproto/serialization.hpp>

#include <caf/binary_deserializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

namespace hyflow::dataproto {

/// Writes u64 length + the wire-format bytes.
inline caf::error inspect(caf::serializer& f, DataProto& x) {
  std::vector<char> bytes;
  try {
    serialize_into(x, bytes);
  } catch (const Error& e) {
    return caf::make_error(caf::sec::invalid_argument, std::string(e.what()));
  }
  uint64_t n = bytes.size();
  if (auto err = f(n)) return err;
  return n ? f.apply_raw(n, bytes.data()) : caf::error{};
}

/// Reads what the serializer overload wrote. Decodes straight from the message buffer when
/// CAF hands us a binary_deserializer; a bad encoding becomes a CAF error, never a crash.
inline caf::error inspect(caf::deserializer& f, DataProto& x) {
  uint64_t n = 0;
  if (auto err = f(n)) return err;
  try {
    if (auto* bin = dynamic_cast<caf::binary_deserializer*>(&f)) {
      if (n > bin->remaining())
        return caf::make_error(caf::sec::end_of_stream,
                               "DataProto of " + std::to_string(n) + " bytes, " +
                                   std::to_string(bin->remaining()) + " left in the message");
      auto rest = bin->remainder();
      x = deserialize({reinterpret_cast<const char*>(rest.data()), static_cast<size_t>(n)});
      bin->skip(static_cast<size_t>(n));
      return {};
    }
    // Other deserializers: read in bounded pieces so a hostile length cannot allocate at once.
    std::vector<char> bytes;
    constexpr uint64_t piece = uint64_t{1} << 20;
    while (bytes.size() < n) {
      const size_t old = bytes.size();
      const size_t k = static_cast<size_t>(std::min<uint64_t>(piece, n - old));
      bytes.resize(old + k);
      if (auto err = f.apply_raw(k, bytes.data() + old)) return err;
    }
    x = deserialize(bytes);
    return {};
  } catch (const Error& e) {
    return caf::make_error(caf::sec::invalid_argument, std::string(e.what()));
  }
}

/// Printing inspectors (deep_to_string): a summary, never the data.
template <class Inspector>
std::enable_if_t<!std::is_base_of_v<caf::serializer, Inspector> && !std::is_base_of_v<caf::deserializer, Inspector>,
                 typename Inspector::result_type>
inspect(Inspector& f, DataProto& x) {
  std::string summary = x.info();
  return f(caf::meta::type_name("hyflow::DataProto"), summary);
}

}  // namespace hyflow::dataproto
