#pragma once
// Everything of hyflow::tracking (trackers, their registry and the Tracking fan-out).

#include <hyflow/tracking/console_tracker.hpp>
#include <hyflow/tracking/jsonl_tracker.hpp>
#include <hyflow/tracking/prometheus_tracker.hpp>
#include <hyflow/tracking/run_info.hpp>
#include <hyflow/tracking/tracker.hpp>
#include <hyflow/tracking/tracker_registry.hpp>
#include <hyflow/tracking/tracking.hpp>
