#pragma once
// verl's _validate: the validation set through the policy's rollout (val_kwargs: greedy by
// default), scored by the validation reward manager, reduced to val-core/val-aux metrics.

#include <hyflow/actors/worker_group.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/reward_manager.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>

namespace hyflow::trainer {

struct ValidationOptions {
  int64_t n = 1;                      ///< rollout.val_kwargs.n: samples per prompt
  bool do_sample = false;             ///< rollout.val_kwargs.do_sample
  std::optional<int64_t> batch_size;  ///< data.val_batch_size (unset: the whole set at once)
  int64_t world = 1;                  ///< the actor group's ranks (batches are padded to it)
  bool multi_turn = false;            ///< rollout.multi_turn.enable: the prompts carry the agent columns
};

/// Generates on `actor` (ActorRolloutRefWorker::generate_sequences with meta_info validate) for
/// every validation prompt and returns verl's validation metrics: per data source and metric
/// val-core / val-aux sections (process_validation_metrics) and val-aux/response_length/mean.
nlohmann::json validate_policy(WorkerGroup& actor, const RLDataset& data, const RewardManager& reward,
                               const ValidationOptions& options);

}  // namespace hyflow::trainer
