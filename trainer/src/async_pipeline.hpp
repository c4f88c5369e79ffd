#pragma once
// AsyncPipeline: the generation side of the asynchronous trainer (trainer.v1.trainer_mode
// colocate_async / separate_async, docs/trainer.md "Trainer modes"). It keeps up to
// num_warmup_batches generation batches in flight ahead of training, each a DataProtoFuture
// (colocate_async: a non-blocking call on the trainer's own actor group; separate_async: calls
// of the rollout group made in order by a SerialExecutor, in partial-rollout segments when
// asked), stamps weight versions, drops or waits for batches that lag more than
// max_off_policy_threshold versions, keeps the replay buffer of dropped prompt groups, and
// publishes the trained weights to the rollout group.

#include <hyflow/actors/all.hpp>
#include <hyflow/dataproto/data_proto_future.hpp>
#include <hyflow/trainer/async_rollout.hpp>
#include <hyflow/trainer/ppo_config.hpp>

#include "data_cursor.hpp"

#include <nlohmann/json.hpp>

#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::trainer {

class AsyncPipeline {
 public:
  /// Rows of the training set -> (the prompt batch with uids, its generation input of rollout.n
  /// rows per prompt); the uids start with the given prefix.
  using Prepare = std::function<std::pair<DataProto, DataProto>(const std::vector<int64_t>&, const std::string&)>;

  /// `actor`: the trainer's actor group (colocate_async generates on it; separate_async exports
  /// its weights); `rollout`: the rollout group (separate_async). Both outlive the pipeline.
  AsyncPipeline(const AsyncSection& options, int64_t max_response_length, int64_t total_steps, DataCursor& data,
                Prepare prepare, WorkerGroup& actor, WorkerGroup* rollout);
  /// Waits for generation calls still running (a step that failed, batches launched ahead of
  /// steps that did not come) before the groups go.
  ~AsyncPipeline();
  AsyncPipeline(const AsyncPipeline&) = delete;
  AsyncPipeline& operator=(const AsyncPipeline&) = delete;

  /// Before the first step: batches launched from now on run on weight version `version`;
  /// separate_async publishes the trainer's weights to the rollout group first.
  void start(int64_t version);

  /// One generation batch fit for training.
  struct Generated {
    DataProto prompts;  ///< the prompts' columns (one row per prompt), uid set
    DataProto output;   ///< the rollout (rollout.n rows per prompt), min/max_weight_version set
    int64_t epoch = 0;
  };
  /// Prompt groups the current step dropped as stale and requeued.
  struct StepCounts {
    int64_t dropped_rows = 0;
    int64_t requeued_groups = 0;
  };
  /// The next batch trainable at `step` (launching more first): batches that lag more than
  /// max_off_policy_threshold versions are dropped (requeued up to max_requeues times) under
  /// drop, and fail under wait. Null when the data of trainer.total_epochs ran out. Adds the wait
  /// to timing_s/gen.
  std::optional<Generated> next(int64_t step, nlohmann::json& metrics, StepCounts& counts);
  /// colocate_async: launches the next batches now, so their generation overlaps this batch's
  /// scoring on the controller; separate_async: after a step took its batches, so they generate
  /// while it trains. `popped_this_step`: the step took its batch already.
  void top_up(int64_t step, bool popped_this_step);
  /// After the actor update of `step`: the new version (colocated) or publishing it every
  /// parameter_sync_step steps (separate_async, timed as timing_s/update_weights).
  void after_actor_update(int64_t step, nlohmann::json& metrics);
  /// After the last step: drops what was launched ahead and waits for what runs.
  void finish();

  /// The data position of the batches taken off the queue (what a checkpoint records: batches
  /// still generating are generated again after a resume).
  int64_t consumed_position() const { return consumed_position_; }
  void set_consumed_position(int64_t position) { consumed_position_ = position; }
  bool requeues() const { return options_.max_requeues > 0; }
  /// Prompt groups requeued and not yet trained: those waiting and those generating again.
  int64_t replay_buffer_groups() const;
  /// The replay buffer as a checkpoint records it: requeued batches still generating, in launch
  /// order, then those waiting.
  nlohmann::json replay_buffer_state() const;
  /// Restores replay_buffer_state() from a checkpoint's trainer state (absent: empty);
  /// FormatError naming `file` for a malformed entry or a row outside the training set.
  void restore_replay_buffer(const nlohmann::json& state, const std::filesystem::path& file, int64_t dataset_size);

 private:
  /// The rows of a generation batch, to requeue it when it is dropped.
  struct Prompts {
    std::vector<int64_t> indices;  // dataset rows
    int64_t epoch = 0;
    int64_t times = 0;   // how often these prompts were requeued
    std::string origin;  // the uid prefix of their first generation batch
  };
  struct InFlight {
    DataProto batch;  // the prompts' columns (not repeated), uid set
    int64_t epoch = 0;
    int64_t position_after = 0;
    int64_t version = 0;  // the weight version at launch (colocate_async stamps the rows with it)
    DataProtoFuture result;
    Prompts prompts;
  };
  void launch();
  void submit_segment(DataProtoPromise promise, DataProto input, int64_t segment);
  /// Returns the bytes sent (export_weights' sync_bytes: the adapters only under LoRA).
  int64_t publish_weights(int64_t version);
  void settle();

  AsyncSection options_;
  int64_t max_response_length_, total_steps_;
  int64_t segments_;
  DataCursor& data_;
  Prepare prepare_;
  WorkerGroup& actor_;
  WorkerGroup* rollout_;
  int64_t generation_version_ = 0;  // the version a generation batch launched now runs on
  int64_t consumed_position_ = 0;
  std::deque<Prompts> requeue_;
  std::deque<InFlight> in_flight_;
  std::unique_ptr<SerialExecutor> executor_;  // last: joined before the rest goes
};

}  // namespace hyflow::trainer
