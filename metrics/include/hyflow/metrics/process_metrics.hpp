#pragma once
// The process' own series, read from /proc/self at scrape time, with the names of Prometheus'
// client libraries: process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_cpu_seconds_total.

#include <hyflow/metrics/registry.hpp>

namespace hyflow::metrics {

/// Adds the collector of this process' memory, file descriptors and CPU time. A value that
/// /proc cannot give (another OS) is left out, never reported as 0.
void add_process_collector(Registry& registry);

}  // namespace hyflow::metrics
