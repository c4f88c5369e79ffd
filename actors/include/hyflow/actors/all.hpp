#pragma once
// Everything of hyflow::actors (the single-controller runtime).

#include <hyflow/actors/call_trace.hpp>
#include <hyflow/actors/colocated.hpp>
#include <hyflow/actors/dispatch.hpp>
#include <hyflow/actors/error.hpp>
#include <hyflow/actors/gpu_allocator.hpp>
#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/resource_pool.hpp>
#include <hyflow/actors/runtime.hpp>
#include <hyflow/actors/value.hpp>
#include <hyflow/actors/worker.hpp>
#include <hyflow/actors/worker_group.hpp>
#include <hyflow/actors/worker_registry.hpp>
