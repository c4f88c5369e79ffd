// FSDP with its ranks in 2 caf-node processes (the shipped caf-node, which hosts the role
// workers): a sharded actor group of one worker per node computes the log-probs, grad norms and
// weights of the same group in-process, and a node killed while the other rank waits inside the
// step's collectives fails the call naming the dead rank (no hang).
#include "node_process.hpp"
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/cluster/all.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

#include <future>

using namespace hyflow;
using namespace hyflow::cluster;
using hyflow::workers::ActorRolloutRefWorker;
using namespace workers_test;
using namespace std::chrono_literals;

namespace {

// A sharded actor (FULL_SHARD over the group by default): one mini-batch of 8 rows, two epochs.
WorkerSpec actor_spec() {
  return WorkerSpec{"ActorRolloutRefWorker",
                    {{"config", actor_rollout_ref_config(8, {{"ppo_epochs", 2}})}, {"role", "actor_rollout_ref"}}};
}

struct StepResult {
  DataProto log_probs;
  Json grad_norms;
  std::vector<std::string> digests;
};

// One sharded update of `wg` (FULL_SHARD over its 2 ranks) on `batch`.
StepResult sharded_step(WorkerGroup& wg, const DataProto& batch) {
  StepResult r;
  r.log_probs = wg.call(&ActorRolloutRefWorker::compute_log_prob, batch);
  DataProto out = wg.call(&ActorRolloutRefWorker::update_actor, batch);
  r.grad_norms = out.meta_info.at("metrics").at("actor/grad_norm");
  r.digests = wg.call(&ActorRolloutRefWorker::parameter_digest);
  return r;
}

}  // namespace

TEST_CASE("a sharded actor with one rank on each of 2 caf-nodes trains like the in-process group") {
  hyflow::workers::register_workers();
  DataProto batch;
  StepResult local;
  {
    Runtime rt;
    WorkerGroup one(rt, ResourcePool({1}), actor_spec());
    one.call(&ActorRolloutRefWorker::init_model);
    DataProto gen = one.call(&ActorRolloutRefWorker::generate_sequences, prompts(8));
    DataProto lp = one.call(&ActorRolloutRefWorker::compute_log_prob, gen);
    gen.union_with(lp.select(std::vector<std::string>{"old_log_probs"}));
    batch = with_advantages(gen, 4);
    WorkerGroup two(rt, ResourcePool({2}), actor_spec());
    two.call(&ActorRolloutRefWorker::init_model);
    local = sharded_step(two, batch);
  }
  REQUIRE(local.digests.size() == 2);
  CHECK(local.digests[0] == local.digests[1]);

  test::NodeProcess a, b;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {a.address(), b.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), actor_spec());  // one worker per node: rank 0 and rank 1 in two processes
    wg.call(&ActorRolloutRefWorker::init_model);
    const auto remote = sharded_step(wg, batch);
    // the same computation and the same gloo reductions in the same order: bit-identical
    CHECK(torch::equal(remote.log_probs.batch.at("old_log_probs"), local.log_probs.batch.at("old_log_probs")));
    CHECK(remote.grad_norms == local.grad_norms);
    CHECK(remote.digests == local.digests);
  }
  rt.reset();
}

namespace {
// The batch of the failure tests: one generated on an in-process worker.
DataProto training_batch() {
  Runtime rt;
  WorkerGroup one(rt, ResourcePool({1}), actor_spec());
  one.call(&ActorRolloutRefWorker::init_model);
  DataProto gen = one.call(&ActorRolloutRefWorker::generate_sequences, prompts(8));
  DataProto lp = one.call(&ActorRolloutRefWorker::compute_log_prob, gen);
  gen.union_with(lp.select(std::vector<std::string>{"old_log_probs"}));
  return with_advantages(gen, 4);
}

// Rank 1's node gets `stop_signal` while rank 0 is inside the sharded step's first all-gather:
// rank 1 is frozen (SIGSTOP) before the call, so rank 0 certainly waits for it; for SIGKILL it
// is killed 300 ms into the call. Returns the call's error message (after at most 20 s: no hang).
std::string failed_step(int stop_signal, int& died_rank, std::string& high_address) {
  hyflow::workers::register_workers();
  const DataProto batch = training_batch();
  test::NodeProcess a, b;
  const auto& low = a.port() < b.port() ? a : b;  // ranks follow the nodes' address order
  auto& high = a.port() < b.port() ? b : a;
  high_address = high.address();
  std::string message;
  auto rt = test::network_runtime();
  {
    auto cluster = RemoteLauncher::connect(*rt, {.nodes = {low.address(), high.address()}});
    rt->set_launcher(cluster);
    WorkerGroup wg(*rt, cluster->pool(1), actor_spec());
    wg.call(&ActorRolloutRefWorker::init_model);
    high.signal(SIGSTOP);
    auto pending = std::async(std::launch::async, [&] { return wg.call(&ActorRolloutRefWorker::update_actor, batch); });
    std::this_thread::sleep_for(300ms);
    if (stop_signal != SIGSTOP) high.signal(stop_signal);
    REQUIRE(pending.wait_for(20s) == std::future_status::ready);  // bounded: no hang in the collective
    try {
      pending.get();
      FAIL("the step succeeded without rank 1");
    } catch (const WorkerDiedError& e) {
      died_rank = e.rank();
      message = e.what();
    } catch (const std::exception& e) {
      died_rank = -1;
      message = e.what();
    }
    high.signal(SIGCONT);
  }
  rt.reset();
  return message;
}
}  // namespace

TEST_CASE("a caf-node frozen while the other rank waits in the sharded step fails the call naming its rank") {
  int died = -1;
  std::string high;
  const std::string message = failed_step(SIGSTOP, died, high);
  CAPTURE(message);
  // The controller's heartbeats name the frozen worker (WorkerDiedError), or rank 0's process
  // group, which stops hearing rank 1, aborts the all-gather naming it: either names rank 1.
  if (died >= 0) {
    CHECK(died == 1);
    CHECK_THAT(message, Catch::Contains(high));
  } else {
    CHECK_THAT(message, Catch::Contains("was aborted: rank 1"));
  }
}

TEST_CASE("a caf-node killed while the other rank waits in the sharded step fails the call, no hang") {
  int died = -1;
  std::string high;
  const std::string message = failed_step(SIGKILL, died, high);
  CAPTURE(message);
  // Either the controller reports the dead worker first (WorkerDiedError naming rank 1 and its
  // node) or rank 0's all-gather fails first on the reset connection; the group's error then
  // counts the other failed rank (gloo names the peer's address, not its rank).
  if (died >= 0) {
    CHECK(died == 1);
    CHECK_THAT(message, Catch::Contains("rank 1") && Catch::Contains(high));
  } else {
    CHECK_THAT(message, Catch::Contains("all_gather_into_tensor") && Catch::Contains("1 more rank(s) failed"));
  }
}
