#pragma once
// CAF 0.17 serialization of Value (for messages between processes; in-process messages are
// passed by reference and never encoded). Futures cannot travel: the caller materializes them
// first, a future reaching the serializer is an error. Only CAF translation units include this.

#include <hyflow/actors/value.hpp>
#include <hyflow/dataproto/caf_inspect.hpp>

#include <caf/binary_deserializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace hyflow::actors {

inline caf::error inspect(caf::serializer& f, Value& x) {
  auto tag = static_cast<uint8_t>(x.storage().index());
  if (x.is_future())
    return caf::make_error(caf::sec::invalid_argument,
                           std::string("a ") + x.kind() + " cannot be sent to another process (materialize it first)");
  if (auto err = f(tag)) return err;
  if (x.is_dataproto()) return f(x.dataproto());
  if (x.is_json()) {
    std::string text = x.json().dump();
    return f(text);
  }
  if (x.is_list()) {
    uint64_t n = x.list().size();
    if (auto err = f(n)) return err;
    for (auto& item : x.list())
      if (auto err = inspect(f, item)) return err;
  }
  return {};
}

namespace detail {

/// Deepest list nesting a decoded Value may have (the decoder recurses once per level).
inline constexpr int kMaxValueDepth = 64;
/// Deepest bracket nesting of a JSON payload inside a decoded Value.
inline constexpr int kMaxJsonDepth = 256;

/// How deep `text` nests arrays and objects (brackets outside strings), stopping at `limit` + 1.
inline int json_depth(const std::string& text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{')
      deepest = std::max(deepest, ++depth);
    else if (c == ']' || c == '}')
      --depth;
    if (deepest > limit) break;
  }
  return deepest;
}

/// Decodes one Value; `depth` is the number of lists it would be nested in if it is a list.
inline caf::error decode_value(caf::deserializer& f, Value& x, int depth) {
  uint8_t tag = 0;
  if (auto err = f(tag)) return err;
  switch (tag) {
    case 0:
      x = Value();
      return {};
    case 1: {
      DataProto d;
      if (auto err = f(d)) return err;
      x = Value(std::move(d));
      return {};
    }
    case 2: {
      std::string text;
      if (auto err = f(text)) return err;
      if (json_depth(text, kMaxJsonDepth) > kMaxJsonDepth)
        return caf::make_error(caf::sec::invalid_argument, "Value: JSON payload of " + std::to_string(text.size()) +
                                                               " bytes nests deeper than " +
                                                               std::to_string(kMaxJsonDepth) + " levels");
      try {
        x = Value(Json::parse(text));
      } catch (const Json::exception& e) {
        return caf::make_error(caf::sec::invalid_argument, std::string("Value: bad JSON payload: ") + e.what());
      }
      return {};
    }
    case 3: {
      if (depth > kMaxValueDepth)
        return caf::make_error(caf::sec::invalid_argument,
                               "Value: lists nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
      uint64_t n = 0;
      if (auto err = f(n)) return err;
      // Each item takes at least its tag byte: a count beyond what is left is a lie.
      if (auto* bin = dynamic_cast<caf::binary_deserializer*>(&f); bin && n > bin->remaining())
        return caf::make_error(caf::sec::invalid_argument, "Value: list of " + std::to_string(n) + " items, " +
                                                               std::to_string(bin->remaining()) +
                                                               " bytes left in the message");
      Value::List items;
      for (uint64_t i = 0; i < n; ++i) {
        Value item;
        if (auto err = decode_value(f, item, depth + 1)) return err;
        items.push_back(std::move(item));
      }
      x = Value(std::move(items));
      return {};
    }
    default:
      return caf::make_error(caf::sec::invalid_argument, "Value: unknown tag " + std::to_string(tag));
  }
}

}  // namespace detail

/// Decodes what the serializer overload wrote. Bounded: lists nest at most
/// detail::kMaxValueDepth levels, JSON payloads detail::kMaxJsonDepth, and a list count cannot
/// exceed the bytes left; anything else is an error naming the bound, never a crash.
inline caf::error inspect(caf::deserializer& f, Value& x) {
  return detail::decode_value(f, x, 1);
}

/// Printing inspectors (deep_to_string): the kind only.
template <class Inspector>
std::enable_if_t<!std::is_base_of_v<caf::serializer, Inspector> && !std::is_base_of_v<caf::deserializer, Inspector>,
                 typename Inspector::result_type>
inspect(Inspector& f, Value& x) {
  std::string kind = x.kind();
  return f(caf::meta::type_name("hyflow::Value"), kind);
}

}  // namespace hyflow::actors
