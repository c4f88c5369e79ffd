#pragma once
// Loads the reference outputs that tests/algos/data/make_*_reference.py wrote with Python.

#include <hyflow/core/error.hpp>

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace hyflow::test {

inline nlohmann::json load_reference(const std::string& name) {
  const std::string path = std::string(HYFLOW_ALGOS_TEST_DATA) + "/" + name;
  std::ifstream in(path);
  if (!in) throw hyflow::Error("cannot open reference file " + path);
  return nlohmann::json::parse(in);
}

}  // namespace hyflow::test
