#pragma once
// Everything of hyflow::tracking (trackers, their registry, the Tracking fan-out and the TFRecord
// framing of TensorBoard's event files).

#include <hyflow/tracking/console_tracker.hpp>
#include <hyflow/tracking/jsonl_tracker.hpp>
#include <hyflow/tracking/prometheus_tracker.hpp>
#include <hyflow/tracking/run_info.hpp>
#include <hyflow/tracking/tensorboard_tracker.hpp>
#include <hyflow/tracking/tfrecord.hpp>
#include <hyflow/tracking/tracker.hpp>
#include <hyflow/tracking/tracker_registry.hpp>
#include <hyflow/tracking/tracking.hpp>
