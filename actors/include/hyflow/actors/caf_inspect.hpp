#pragma once
// CAF 0.17 serialization of Value (for messages between processes; in-process messages are
// passed by reference and never encoded). Futures cannot travel: the caller materializes them
// first, a future reaching the serializer is an error. Only CAF translation units include this.

#include <hyflow/actors/value.hpp>
#include <hyflow/dataproto/caf_inspect.hpp>

#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

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

inline caf::error inspect(caf::deserializer& f, Value& x) {
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
      try {
        x = Value(Json::parse(text));
      } catch (const Json::exception& e) {
        return caf::make_error(caf::sec::invalid_argument, std::string("Value: bad JSON payload: ") + e.what());
      }
      return {};
    }
    case 3: {
      uint64_t n = 0;
      if (auto err = f(n)) return err;
      Value::List items;
      for (uint64_t i = 0; i < n; ++i) {
        Value item;
        if (auto err = inspect(f, item)) return err;
        items.push_back(std::move(item));
      }
      x = Value(std::move(items));
      return {};
    }
    default:
      return caf::make_error(caf::sec::invalid_argument, "Value: unknown tag " + std::to_string(tag));
  }
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
