// process_* series from /proc/self (Linux).
#include <hyflow/metrics/process_metrics.hpp>

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace hyflow::metrics {
namespace {

void collect_memory(CollectorSink& out) {
  std::ifstream statm("/proc/self/statm");
  long pages_virtual = 0, pages_resident = 0;
  if (!(statm >> pages_virtual >> pages_resident)) return;
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  out.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", {}, pages_resident * page);
  out.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", {}, pages_virtual * page);
}

void collect_fds(CollectorSink& out) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  long n = 0;
  while (readdir(dir)) ++n;
  closedir(dir);
  // ".", ".." and the descriptor of the listing itself
  out.gauge("process_open_fds", "Number of open file descriptors.", {}, static_cast<double>(n - 3));
}

void collect_cpu(CollectorSink& out) {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return;
  const auto close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // fields 3.. of proc(5); utime 14, stime 15
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  if (!fields) return;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  out.counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", {},
              static_cast<double>(utime + stime) / ticks);
}

}  // namespace

void add_process_collector(Registry& registry) {
  registry.add_collector([](CollectorSink& out) {
    collect_memory(out);
    collect_fds(out);
    collect_cpu(out);
  });
}

}  // namespace hyflow::metrics
