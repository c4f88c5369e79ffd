// Resource pools with GPUs: which device setting gives workers GPUs, the refusal of more GPU
// workers than a node offers (naming the node), the devices placement hands out, and the
// GpuAllocator that keeps pools sharing a host (a process, a caf-node) on disjoint GPUs.
#include <hyflow/actors/gpu_allocator.hpp>
#include <hyflow/actors/resource_pool.hpp>
#include <hyflow/core/error.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;

TEST_CASE("trainer.device=cpu never asks for GPUs, even where nodes have them") {
  CHECK_FALSE(ResourcePool::wants_gpus("cpu", {2, 2}, {8, 8}));
  CHECK_FALSE(ResourcePool::wants_gpus("cpu", {2}, {0}));
}

TEST_CASE("trainer.device=auto takes GPUs only when every node has one per worker") {
  CHECK(ResourcePool::wants_gpus("auto", {2, 2}, {2, 4}));
  CHECK_FALSE(ResourcePool::wants_gpus("auto", {2, 2}, {2, 1}));
  CHECK_FALSE(ResourcePool::wants_gpus("auto", {1}, {0}));
  CHECK_FALSE(ResourcePool::wants_gpus("auto", {1, 1}, {1}));  // a node that advertised nothing
}

TEST_CASE("trainer.device=cuda with too few GPUs on a node is a ValueError naming the key, the node and counts") {
  CHECK(ResourcePool::wants_gpus("cuda", {2, 2}, {2, 2}));
  CHECK_THROWS_AS(ResourcePool::wants_gpus("cuda", {2, 3}, {2, 2}), ValueError);
  CHECK_THROWS_WITH(ResourcePool::wants_gpus("cuda", {2, 3}, {2, 2}),
                    Catch::Contains("'trainer.device'") && Catch::Contains("node 1 offers 2 CUDA device(s)") &&
                        Catch::Contains("its 3 workers"));
  CHECK_THROWS_WITH(ResourcePool::wants_gpus("cuda", {1}, {0}), Catch::Contains("node 0 offers 0"));
  CHECK_THROWS_WITH(ResourcePool::wants_gpus("cuda", {1}, {0}, "actor_rollout_ref.rollout.device"),
                    Catch::Contains("'actor_rollout_ref.rollout.device'"));
}

TEST_CASE("an unknown device setting is a ValueError naming the key and the value") {
  CHECK_THROWS_WITH(ResourcePool::wants_gpus("gpu", {1}, {1}),
                    Catch::Contains("'trainer.device'") && Catch::Contains("'gpu'") &&
                        Catch::Contains("cpu, cuda or auto"));
}

TEST_CASE("a GPU pool refuses more workers on a node than it has GPUs, naming the node") {
  CHECK_THROWS_WITH(ResourcePool({2, 3}, 10, 2, true), Catch::Contains("node 1 asks for 3 GPU workers"));
  CHECK_NOTHROW(ResourcePool({2, 3}, 10, 2, false));  // CPU workers: no limit from the GPUs
}

TEST_CASE("GPU placement gives each worker cuda:<local rank>, CPU placement cpu") {
  const auto envs = ResourcePool({2, 3}, 10, 4, true).place("", "w", "127.0.0.1", 1);
  std::vector<std::string> devices;
  for (const auto& e : envs) devices.push_back(e.device);
  CHECK(devices == std::vector<std::string>{"cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:2"});
  for (const auto& e : ResourcePool({2}).place("", "w", "127.0.0.1", 1)) CHECK(e.device == "cpu");
}

namespace {
std::vector<std::string> devices_of(const ResourcePool& pool) {
  std::vector<std::string> out;
  for (const auto& e : pool.place("", "w", "127.0.0.1", 1)) out.push_back(e.device);
  return out;
}
}  // namespace

TEST_CASE("two pools on one host get disjoint GPUs: training pool and a separate rollout pool") {
  GpuAllocator gpus({{.name = "this process", .gpus = 4}});
  ResourcePool global({2}, 10, 4, true), rollout({2}, 10, 4, true);
  gpus.assign(global, "global");
  gpus.assign(rollout, "rollout");
  CHECK(devices_of(global) == std::vector<std::string>{"cuda:0", "cuda:1"});
  CHECK(devices_of(rollout) == std::vector<std::string>{"cuda:2", "cuda:3"});
  CHECK(gpus.free(0) == 0);
}

TEST_CASE("in-process nodes share the process's GPUs: each node of a pool gets devices of its own") {
  GpuAllocator gpus({{.name = "this process", .gpus = 4}});
  ResourcePool pool({2, 2}, 10, 4, true);
  gpus.assign(pool, "global", {0, 0});
  CHECK(devices_of(pool) == std::vector<std::string>{"cuda:0", "cuda:1", "cuda:2", "cuda:3"});
  const auto envs = pool.place("", "w", "127.0.0.1", 1);
  CHECK(envs[2].local_rank == 0);  // the local rank stays the rank within the node
}

TEST_CASE("pools on different caf-nodes draw from each node's own GPUs") {
  GpuAllocator gpus({{.name = "node 10.0.0.1:4242", .gpus = 2}, {.name = "node 10.0.0.2:4242", .gpus = 2}});
  ResourcePool global({1, 1}, 10, 2, true), rollout({1, 1}, 10, 2, true);
  gpus.assign(global, "global");
  gpus.assign(rollout, "rollout");
  CHECK(devices_of(global) == std::vector<std::string>{"cuda:0", "cuda:0"});
  CHECK(devices_of(rollout) == std::vector<std::string>{"cuda:1", "cuda:1"});
}

TEST_CASE("too few GPUs for every pool of a host is a ValueError naming the pools, and takes nothing") {
  GpuAllocator gpus({{.name = "this process", .gpus = 3}});
  ResourcePool global({2}, 10, 3, true), rollout({2}, 10, 3, true);
  gpus.assign(global, "global");
  CHECK_THROWS_AS(gpus.assign(rollout, "rollout"), ValueError);
  CHECK_THROWS_WITH(gpus.assign(rollout, "rollout"),
                    Catch::Contains("resource pool 'rollout' needs 2 GPU(s)") && Catch::Contains("this process") &&
                        Catch::Contains("3 CUDA device(s)") && Catch::Contains("pool 'global' holds cuda:0, cuda:1"));
  CHECK(gpus.free(0) == 1);
  CHECK(rollout.devices().empty());
  ResourcePool one({1}, 10, 3, true);
  gpus.assign(one, "rm");
  CHECK(devices_of(one) == std::vector<std::string>{"cuda:2"});
}

TEST_CASE("two in-process nodes of 2 on a 3-GPU process are refused, naming the pool's own devices") {
  GpuAllocator gpus({{.name = "this process", .gpus = 3}});
  ResourcePool pool({2, 2}, 10, 3, true);
  CHECK_THROWS_WITH(gpus.assign(pool, "global", {0, 0}),
                    Catch::Contains("for node 1") && Catch::Contains("pool 'global' holds cuda:0, cuda:1"));
  CHECK(gpus.free(0) == 3);
}

TEST_CASE("a pool shared by colocated roles keeps its devices for every group made from it; CPU pools draw none") {
  GpuAllocator gpus({{.name = "this process", .gpus = 2}});
  ResourcePool pool({2}, 10, 2, true), cpu({4});
  gpus.assign(pool, "global");
  gpus.assign(cpu, "critic");
  // every group placed on the pool (a colocated worker's roles, or roles that share a pool) sees these
  CHECK(devices_of(pool) == std::vector<std::string>{"cuda:0", "cuda:1"});
  CHECK(devices_of(pool) == std::vector<std::string>{"cuda:0", "cuda:1"});
  CHECK(devices_of(cpu) == std::vector<std::string>(4, "cpu"));
  CHECK(gpus.free(0) == 0);
}

TEST_CASE("set_devices checks the pool's shape") {
  ResourcePool pool({2, 1}, 10, 4, true);
  CHECK_THROWS_WITH(pool.set_devices({{0, 1}}), Catch::Contains("1 nodes of devices for a pool of 2 nodes"));
  CHECK_THROWS_WITH(pool.set_devices({{0}, {1}}), Catch::Contains("node 0 gets [0] for its 2 workers"));
  CHECK_THROWS_WITH(ResourcePool({1}).set_devices({{0}}), Catch::Contains("has no GPUs"));
  pool.set_devices({{3, 1}, {2}});
  CHECK(devices_of(pool) == std::vector<std::string>{"cuda:3", "cuda:1", "cuda:2"});
  CHECK_THROWS_WITH(pool.add_node(1), Catch::Contains("assigned already"));
}
