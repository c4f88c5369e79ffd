#pragma once
// hyflow::metrics: Prometheus metrics of a process (docs/metrics.md).

#include <hyflow/metrics/names.hpp>
#include <hyflow/metrics/process_metrics.hpp>
#include <hyflow/metrics/registry.hpp>
#include <hyflow/metrics/server.hpp>
