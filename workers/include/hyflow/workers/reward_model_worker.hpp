#pragma once
// RewardModelWorker: a score model that rates whole responses (verl's RewardModelWorker).
// Init args: {"config": <reward_model subtree>}. The model reads the same token ids as the
// policy (no re-tokenization with another chat template).

#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/workers/config.hpp>

#include <c10/core/Device.h>

#include <memory>

namespace hyflow::parallel {
class DataParallelOptimizer;
class ProcessGroup;
}  // namespace hyflow::parallel

namespace hyflow::workers {

class RewardModelWorker : public Worker {
 public:
  explicit RewardModelWorker(const Json& args);

  /// Loads the score model from model.path. ONE_TO_ALL.
  void init_model();
  /// {"rm_scores"} (B, R) float32: the model's score at the last valid token of each row,
  /// placed at that position of the response (valid response length - 1), zeros elsewhere.
  /// DP_COMPUTE_PROTO.
  DataProto compute_rm_score(DataProto data);

  const RewardModelConfig& config() const { return config_; }
  static void define_methods(MethodTable<RewardModelWorker>& t);

 private:
  RewardModelConfig config_;
  c10::Device device_;
  std::shared_ptr<parallel::ProcessGroup> group_;
  models::ValueModel model_{nullptr};
};

}  // namespace hyflow::workers
