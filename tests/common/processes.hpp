#pragma once
// Counting live processes by their command line, for the tests that check a sandboxed or
// black-box program was killed with its process group (tests/agents, tests/trainer). Included as
// "common/processes.hpp".

#include <dirent.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace hyflow::testing {

/// Processes whose command line holds `marker` (the programs under test carry one as an argument).
/// std::runtime_error when /proc cannot be read.
inline int processes_with(const std::string& marker) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) throw std::runtime_error("processes_with: cannot open /proc");
  int count = 0;
  while (dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + entry->d_name + "/cmdline");
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().find(marker) != std::string::npos) ++count;
  }
  ::closedir(proc);
  return count;
}

}  // namespace hyflow::testing
