// Resource pools with GPUs: which device setting gives workers GPUs, the refusal of more GPU
// workers than a node offers (naming the node), and the devices placement hands out.
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
