#pragma once
// One benchmark figure as one JSON line on stdout (the format of bench/README.md): `ratio` is
// oriented so that higher is better for hyflow, the peer is measured in the same run.

#include <nlohmann/json.hpp>

#include <iostream>
#include <string>

namespace hyflow_bench {

inline void emit(const std::string& bench, const std::string& case_name, double value, const std::string& unit,
                 const std::string& peer, double peer_value, double ratio) {
  const nlohmann::json line{{"bench", bench}, {"case", case_name},        {"value", value}, {"unit", unit},
                            {"peer", peer},   {"peer_value", peer_value}, {"ratio", ratio}};
  std::cout << line.dump() << std::endl;
}

}  // namespace hyflow_bench
