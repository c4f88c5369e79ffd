#include <hyflow/core/config_key.hpp>

namespace hyflow {

const char* to_string(KeyType type) {
  switch (type) {
    case KeyType::integer:
      return "integer";
    case KeyType::number:
      return "number";
    case KeyType::boolean:
      return "boolean";
    case KeyType::string:
      return "string";
    case KeyType::list:
      return "list";
  }
  return "?";
}

}  // namespace hyflow
