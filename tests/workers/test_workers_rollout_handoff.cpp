// The colocated rollout's weight handoff figures (generate_sequences' meta_info): verl's
// sharding-manager timing "reshard" and the peak bytes of full parameters it gathered.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using namespace workers_test;

namespace {
WorkerGroup actor_group(Runtime& rt, int ws, const Json& fsdp_config) {
  hyflow::workers::register_workers();
  Json config = actor_rollout_ref_config(8);  // a mini-batch of 8 rows divides over 4 workers
  config["actor"]["fsdp_config"] = fsdp_config;
  WorkerGroup wg(rt, ResourcePool({ws}),
                 WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", "actor_rollout_ref"}}});
  wg.call(&ActorRolloutRefWorker::init_model);
  return wg;
}

int64_t full_parameter_bytes() {
  int64_t bytes = 0;
  for (const auto& p : models::load_causal_lm(tiny_model_dir())->parameters()) bytes += p.numel() * 4;
  return bytes;
}
}  // namespace

TEST_CASE("a sharded colocated rollout reports its gather time and the full model as its peak extra bytes") {
  Runtime rt;
  struct Case {
    const char* name;
    int workers;
    Json fsdp_config;
    bool sharded;
  };
  for (const auto& c : {Case{"FULL_SHARD", 2, {{"fsdp_size", -1}}, true},
                        Case{"SHARD_GRAD_OP", 2, {{"reshard_after_forward", false}}, true},
                        Case{"HYBRID_SHARD", 4, {{"fsdp_size", 2}}, true},
                        Case{"NO_SHARD", 2, {{"fsdp_size", 1}}, false}, Case{"one worker", 1, Json::object(), false}}) {
    SECTION(std::string(c.name) + " on " + std::to_string(c.workers) + " workers") {
      auto wg = actor_group(rt, c.workers, c.fsdp_config);
      for (int call = 0; call < 2; ++call) {  // the second call starts from the resharded state again
        CAPTURE(call);
        DataProto gen = wg.call(&ActorRolloutRefWorker::generate_sequences, prompts(4));
        // the ranks agree (their parts concatenate): the mean time, the largest peak
        REQUIRE(gen.meta_info.contains("timing"));
        REQUIRE(gen.meta_info.at("timing").contains("reshard"));
        const double reshard_s = gen.meta_info.at("timing").at("reshard").get<double>();
        const int64_t peak = gen.meta_info.at("reshard_peak_extra_bytes").get<int64_t>();
        if (c.sharded) {
          CHECK(reshard_s > 0);
          // every unit is gathered for generation (one at a time, kept until it ends): the whole model
          CHECK(peak == full_parameter_bytes());
        } else {
          CHECK(reshard_s == 0);  // replicated: nothing to gather
          CHECK(peak == 0);
        }
      }
    }
  }
}
