// Workers' devices: the device string of a worker resolved against what the process sees
// (CUDA_VISIBLE_DEVICES semantics), the pinned staging of DataProto into the worker and back,
// and a pool asking for GPUs the machine does not have.
#include "../../workers/src/worker_common.hpp"
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using namespace hyflow::workers::detail;
using namespace workers_test;

TEST_CASE("CUDA_VISIBLE_DEVICES lists split on commas; unset is empty") {
  CHECK(visible_devices(nullptr).empty());
  CHECK(visible_devices("").empty());
  CHECK(visible_devices("3") == std::vector<std::string>{"3"});
  CHECK(visible_devices("4, 6,7") == std::vector<std::string>{"4", "6", "7"});
  CHECK(visible_devices("GPU-8d1c,GPU-aa02") == std::vector<std::string>{"GPU-8d1c", "GPU-aa02"});
}

TEST_CASE("cpu is the CPU, and auto is the CPU where no GPU is visible") {
  for (const char* d : {"cpu", "", "auto"}) {
    CAPTURE(d);
    const auto got = worker_device(d, 0, {});
    CHECK(got.device.is_cpu());
    CHECK(got.physical.empty());
  }
  CHECK(worker_device("cpu", 4, {}).device.is_cpu());  // cpu stays cpu on a GPU machine
}

TEST_CASE("asking for cuda without a visible GPU is a ValueError naming trainer.device") {
  for (const char* d : {"cuda", "cuda:0", "cuda:3"}) {
    CAPTURE(d);
    CHECK_THROWS_AS(worker_device(d, 0, {}), ValueError);
    CHECK_THROWS_WITH(worker_device(d, 0, {}), Catch::Contains("trainer.device") && Catch::Contains(d) &&
                                                   Catch::Contains("no CUDA device is visible"));
  }
  CHECK_THROWS_WITH(worker_device("cuda:0", 0, {"5"}), Catch::Contains("CUDA_VISIBLE_DEVICES=5"));
  CHECK_THROWS_WITH(worker_device("tpu", 1, {}), Catch::Contains("trainer.device"));
}

TEST_CASE("local rank i runs on cuda:i, the i-th entry of CUDA_VISIBLE_DEVICES") {
  const std::vector<std::string> visible{"4", "6", "7"};
  for (int64_t local = 0; local < 3; ++local) {
    const auto got = worker_device("cuda:" + std::to_string(local), 3, visible);
    CHECK(got.device == c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local)));
    CHECK(got.physical == visible[static_cast<size_t>(local)]);
  }
  CHECK(worker_device("cuda", 3, visible).physical == "4");
  CHECK(worker_device("auto", 3, visible).device == c10::Device(c10::kCUDA, 0));
  // unset: logical index = physical index
  CHECK(worker_device("cuda:1", 2, {}).physical == "1");
  // a local rank past the visible devices names the list and the key to change
  CHECK_THROWS_WITH(worker_device("cuda:3", 3, visible), Catch::Contains("CUDA_VISIBLE_DEVICES=4,6,7") &&
                                                             Catch::Contains("local rank 3") &&
                                                             Catch::Contains("trainer.n_gpus_per_node"));
}

TEST_CASE("a CPU worker's process group is gloo without a device, as before") {
  const WorkerEnv env{.rank = 1, .world_size = 4, .local_rank = 1, .master_port = 29500};
  for (bool nccl : {false, true}) {
    const auto o = process_group_options(env, c10::Device(c10::kCPU), nccl);
    CHECK(o.backend == parallel::Backend::gloo);
    CHECK(o.device == -1);
    CHECK(o.rank == 1);
    CHECK(o.world_size == 4);
    CHECK(o.master_port == 29500);
    CHECK(o.name == "hyflow.workers");
  }
}

TEST_CASE("a worker on cuda:k gets an nccl group on device k (with a gloo side for CPU tensors)") {
  const WorkerEnv env{.rank = 2, .world_size = 4, .local_rank = 0, .master_port = 29500, .device = "cuda:3"};
  const auto o = process_group_options(env, c10::Device("cuda:3"), /*nccl=*/true);
  CHECK(o.backend == parallel::Backend::nccl);
  CHECK(o.device == 3);  // the worker's own index, not the current device (0 on every thread)
  CHECK(process_group_options(env, c10::Device("cuda"), true).device == 0);
  // a build without NCCL keeps the worker on gloo
  const auto gloo = process_group_options(env, c10::Device("cuda:3"), /*nccl=*/false);
  CHECK(gloo.backend == parallel::Backend::gloo);
  CHECK(gloo.device == -1);
}

TEST_CASE("nccl_timeout is the worker group's collective timeout; the roles of a worker must agree on it") {
  const WorkerEnv env{.rank = 0, .world_size = 2, .local_rank = 0, .master_port = 29500, .device = "cuda:1"};
  CHECK(process_group_options(env, c10::Device("cuda:1"), true, std::chrono::seconds(1200)).collective_timeout ==
        std::chrono::milliseconds(1200000));
  CHECK(process_group_options(env, c10::Device(c10::kCPU), true).collective_timeout == std::chrono::seconds(600));

  // The group is made once per worker host, by the first role, with that role's timeout.
  actors::WorkerHost host;
  std::vector<std::chrono::seconds> made;
  auto make = [&](const GroupTimeout& t) {
    made.push_back(t.seconds);
    return std::shared_ptr<parallel::ProcessGroup>();
  };
  const GroupTimeout actor{std::chrono::seconds(1200), "actor_rollout_ref.nccl_timeout"};
  (void)host_group(host, actor, make);
  (void)host_group(host, {std::chrono::seconds(1200), "critic.nccl_timeout"}, make);  // equal: shares it
  CHECK(made == std::vector<std::chrono::seconds>{std::chrono::seconds(1200)});
  CHECK_THROWS_AS(host_group(host, {std::chrono::seconds(600), "critic.nccl_timeout"}, make), ValueError);
  CHECK_THROWS_WITH(host_group(host, {std::chrono::seconds(600), "critic.nccl_timeout"}, make),
                    Catch::Contains("'critic.nccl_timeout' is 600 s") &&
                        Catch::Contains("'actor_rollout_ref.nccl_timeout' = 1200 s"));
  CHECK(made.size() == 1);
}

TEST_CASE("a separate rollout pool's workers get NCCL groups on their own GPUs, not on their local ranks") {
  GpuAllocator gpus({{.name = "this process", .gpus = 4}});
  ResourcePool global({2}, 10, 4, true), rollout({2}, 10, 4, true);
  gpus.assign(global, "global");
  gpus.assign(rollout, "rollout");
  std::vector<int> devices;
  for (const auto* pool : {&global, &rollout})
    for (const auto& env : pool->place("", "w", "127.0.0.1", 29500))
      devices.push_back(process_group_options(env, c10::Device(env.device), true).device);
  CHECK(devices == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("staging onto the CPU passes tensors through: same storage, keys, dtypes and meta_info") {
  auto data = prompts(3);
  data.batch.set("scores", torch::rand({3, 5}, torch::kFloat64));
  data.batch.set("flags", torch::ones({3}, torch::kBool));
  data.meta_info["temperature"] = 0.7;
  const std::vector<std::string> keys{"input_ids", "scores", "flags", "absent"};
  const auto staged = on_device(data, keys, c10::Device(c10::kCPU));
  CHECK(staged.batch.keys() == std::vector<std::string>{"input_ids", "scores", "flags"});
  for (const auto& key : staged.batch.keys()) {
    CAPTURE(key);
    CHECK(staged.batch.at(key).data_ptr() == data.batch.at(key).data_ptr());  // no copy
    CHECK(staged.batch.at(key).scalar_type() == data.batch.at(key).scalar_type());
    CHECK(staged.batch.at(key).device().is_cpu());
  }
  CHECK(staged.meta_info.at("temperature") == 0.7);
  CHECK(data.batch.contains("attention_mask"));  // the input is untouched

  DataProto copy = staged;
  to_host(copy);
  for (const auto& key : copy.batch.keys()) CHECK(copy.batch.at(key).data_ptr() == data.batch.at(key).data_ptr());
}

TEST_CASE("a worker placed on cuda without a GPU fails to start, naming its device and trainer.device") {
  if (torch::cuda::is_available()) {
    WARN("a CUDA device is visible: the no-GPU error path is not exercised here");
    return;
  }
  hyflow::workers::register_workers();
  Runtime rt;
  const WorkerSpec spec{"ActorRolloutRefWorker",
                        {{"config", actor_rollout_ref_config(4)}, {"role", "actor_rollout_ref"}}};
  CHECK_THROWS_WITH(WorkerGroup(rt, ResourcePool({1}, 10, 1, /*use_gpu=*/true), spec),
                    Catch::Contains("cuda:0") && Catch::Contains("trainer.device"));
  WorkerGroup cpu(rt, ResourcePool({1}), spec);  // the same spec starts on the CPU
  cpu.call(&ActorRolloutRefWorker::init_model);
}
