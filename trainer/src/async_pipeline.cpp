#include "async_pipeline.hpp"

#include "trainer_metrics.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/workers/actor_rollout_ref_worker.hpp>

#include <torch/torch.h>

namespace hyflow::trainer {

using workers::ActorRolloutRefWorker;

AsyncPipeline::AsyncPipeline(const AsyncSection& options, int64_t max_response_length, int64_t total_steps,
                             DataCursor& data, Prepare prepare, WorkerGroup& actor, WorkerGroup* rollout)
    : options_(options),
      max_response_length_(max_response_length),
      total_steps_(total_steps),
      segments_(options.partial_rollout ? options.partial_rollout_segments : 1),
      data_(data),
      prepare_(std::move(prepare)),
      actor_(actor),
      rollout_(rollout) {
  if (options_.separate()) {
    if (!rollout_) throw ValueError("separate_async: no rollout group was placed");
    executor_ = std::make_unique<SerialExecutor>();
  }
}

AsyncPipeline::~AsyncPipeline() {
  settle();
}

void AsyncPipeline::settle() {
  if (options_.colocate()) {
    for (auto& item : in_flight_) {
      try {
        if (item.result.valid()) (void)item.result.get();
      } catch (...) {  // a failed generation has nothing left running
      }
    }
  }
  in_flight_.clear();
}

void AsyncPipeline::start(int64_t version) {
  generation_version_ = version;
  if (options_.separate()) publish_weights(version);  // the rollout group starts from the trained weights
}

void AsyncPipeline::launch() {
  Prompts prompts;
  if (!requeue_.empty()) {  // the replay buffer goes first; it takes no fresh data
    prompts = std::move(requeue_.front());
    requeue_.pop_front();
  } else {
    // uids name the generation batch: it is trained at an unknown step
    prompts.origin = "b";
    prompts.origin += std::to_string(data_.position());
    const auto indices = data_.next(prompts.epoch);
    if (!indices) throw Error("AsyncPipeline::launch: no training data left");  // top_up checks first
    prompts.indices = *indices;
  }
  const std::string uid_prefix =
      prompts.origin + (prompts.times > 0 ? "-r" + std::to_string(prompts.times) : std::string()) + "-";
  auto [batch, gen_batch] = prepare_(prompts.indices, uid_prefix);
  InFlight item{std::move(batch), prompts.epoch, data_.position(), generation_version_, {}, std::move(prompts)};
  if (options_.colocate()) {
    // Issued from the controller thread before this step's log-prob and update calls, so every
    // rank receives it first: it samples with the weights of now, and the ranks' call order
    // (hence their RNG draws) is the controller's order, not timing.
    item.result =
        actor_.call(CallOptions{.blocking = false}, &ActorRolloutRefWorker::generate_sequences, std::move(gen_batch));
    in_flight_.push_back(std::move(item));
    return;
  }
  DataProtoPromise promise;
  item.result = promise.get_future();
  in_flight_.push_back(std::move(item));
  submit_segment(std::move(promise), std::move(gen_batch), 0);
}

void AsyncPipeline::submit_segment(DataProtoPromise promise, DataProto input, int64_t segment) {
  // Segment k of S generates R/S tokens (the first R mod S segments one more). A weight update
  // published meanwhile is queued before the next segment, so the rows go on with the new version.
  const int64_t length = max_response_length_ / segments_ + (segment < max_response_length_ % segments_);
  executor_->submit([this, promise = std::move(promise), input = std::move(input), segment, length]() mutable {
    if (auto error = executor_->failure()) {
      promise.set_exception(error);
      return;
    }
    try {
      input.meta_info["response_length"] = length;
      DataProto out = segment == 0 ? DataProto(rollout_->call(&ActorRolloutRefWorker::generate_sequences, input))
                                   : DataProto(rollout_->call(&ActorRolloutRefWorker::continue_sequences, input));
      if (segment + 1 < segments_) {
        submit_segment(std::move(promise), std::move(out), segment + 1);
        return;
      }
      promise.set_value(std::move(out));
    } catch (...) {
      promise.set_exception(std::current_exception());
      throw;  // marks the executor failed: later generations do not run on an unknown state
    }
  });
}

void AsyncPipeline::top_up(int64_t step, bool popped_this_step) {
  const bool wait = options_.max_off_policy_strategy == "wait";
  while (static_cast<int64_t>(in_flight_.size()) < options_.num_warmup_batches() &&
         (!requeue_.empty() || data_.has_next())) {
    // A batch launched now runs on generation_version_; each step takes at least one batch, so at
    // queue position q it is trained at the latest by step `step + q` (+1 once this step took its
    // batch), whose update starts from version step + q - 1 (+1).
    const int64_t trained_version_bound =
        step - 1 + static_cast<int64_t>(in_flight_.size()) + (popped_this_step ? 1 : 0);
    if (wait && trained_version_bound - generation_version_ > options_.max_off_policy_threshold) break;
    launch();
  }
}

std::optional<AsyncPipeline::Generated> AsyncPipeline::next(int64_t step, nlohmann::json& metrics, StepCounts& counts) {
  const int64_t trained_version = step - 1;  // the version this step's update starts from
  for (;;) {
    top_up(step, /*popped_this_step=*/false);
    if (in_flight_.empty()) return std::nullopt;  // the data of total_epochs ran out
    InFlight item = std::move(in_flight_.front());
    in_flight_.pop_front();
    consumed_position_ = item.position_after;
    DataProto out;
    {
      Timer t(metrics, "gen");  // verl V1: the trainer's wait for its next batch
      out = item.result.get();
    }
    if (options_.colocate()) {  // the colocated actor holds no published version: the controller knows it
      const auto version = torch::full({out.size()}, item.version, torch::kLong);
      out.batch.set("min_weight_version", version);
      out.batch.set("max_weight_version", version.clone());
    }
    const int64_t worst = trained_version - out.batch.at("min_weight_version").min().item<int64_t>();
    if (worst <= options_.max_off_policy_threshold) {
      // colocate_async: the next batches go to the workers now, so their generation overlaps this
      // batch's scoring and preparation on the controller (and queues before this step's calls)
      if (options_.colocate() && step < total_steps_) top_up(step, /*popped_this_step=*/true);
      return Generated{std::move(item.batch), std::move(out), item.epoch};
    }
    if (options_.max_off_policy_strategy == "wait")
      throw Error(options_.trainer_mode + ": a generation batch lags " + std::to_string(worst) +
                  " versions under the wait strategy (max_off_policy_threshold " +
                  std::to_string(options_.max_off_policy_threshold) + ")");
    counts.dropped_rows += out.size();                 // all its groups started on that version
    if (item.prompts.times < options_.max_requeues) {  // the replay buffer: generate them again on newer weights
      counts.requeued_groups += static_cast<int64_t>(item.prompts.indices.size());
      ++item.prompts.times;
      requeue_.push_back(std::move(item.prompts));
    }
  }
}

int64_t AsyncPipeline::publish_weights(int64_t version) {
  const Value parts = actor_.call(&ActorRolloutRefWorker::export_weights);  // one DataProto per rank
  if (!parts.is_list() || parts.list().empty() || !parts.list().front().is_dataproto())
    throw Error("export_weights: expected one DataProto per rank, got " + parts.kind());
  DataProto weights = parts.list().front().dataproto();  // rank 0 answers for the whole actor
  weights.meta_info["weight_version"] = version;
  const int64_t bytes = weights.meta_info.value("sync_bytes", int64_t{0});
  generation_version_ = version;  // batches launched from now on queue behind this load
  executor_->submit([this, weights = std::move(weights)] {
    if (executor_->failure()) return;
    rollout_->call(&ActorRolloutRefWorker::load_weights, weights);
  });
  return bytes;
}

void AsyncPipeline::after_actor_update(int64_t step, nlohmann::json& metrics) {
  if (options_.colocate()) {
    generation_version_ = step;
  } else if (step % options_.parameter_sync_step == 0) {
    Timer t(metrics, "update_weights");
    metrics["training/weight_sync/bytes"] = publish_weights(step);
  }
  // what the next batches generate on, and how many are launched ahead (the prometheus tracker's gauges)
  metrics["training/off_policy/rollout_weight_version"] = generation_version_;
  metrics["training/off_policy/queued_batches"] = static_cast<int64_t>(in_flight_.size());
}

void AsyncPipeline::finish() {
  if (executor_) {  // generation batches launched ahead of steps that will not come
    executor_->drain();
    in_flight_.clear();
  }
  settle();
}

int64_t AsyncPipeline::replay_buffer_groups() const {
  int64_t groups = 0;
  for (const auto& item : in_flight_)
    if (item.prompts.times > 0) groups += static_cast<int64_t>(item.prompts.indices.size());
  for (const auto& r : requeue_) groups += static_cast<int64_t>(r.indices.size());
  return groups;
}

nlohmann::json AsyncPipeline::replay_buffer_state() const {
  nlohmann::json out = nlohmann::json::array();
  auto add = [&](const Prompts& r) {
    out.push_back({{"indices", r.indices}, {"epoch", r.epoch}, {"times", r.times}, {"origin", r.origin}});
  };
  for (const auto& item : in_flight_)
    if (item.prompts.times > 0) add(item.prompts);
  for (const auto& r : requeue_) add(r);
  return out;
}

void AsyncPipeline::restore_replay_buffer(const nlohmann::json& state, const std::filesystem::path& file,
                                          int64_t dataset_size) {
  requeue_.clear();
  if (!state.contains("replay_buffer")) return;
  const auto& list = state.at("replay_buffer");
  auto bad = [&](size_t i) {
    return FormatError(file.string() + ": replay_buffer[" + std::to_string(i) +
                       "] is not {indices: [int], epoch: int, times: int, origin: string}");
  };
  if (!list.is_array()) throw FormatError(file.string() + ": replay_buffer is not a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& e = list[i];
    if (!e.is_object() || !e.contains("indices") || !e.at("indices").is_array() || !e.contains("epoch") ||
        !e.at("epoch").is_number_integer() || !e.contains("times") || !e.at("times").is_number_integer() ||
        !e.contains("origin") || !e.at("origin").is_string())
      throw bad(i);
    Prompts r;
    for (const auto& index : e.at("indices")) {
      if (!index.is_number_integer()) throw bad(i);
      const int64_t row = index.get<int64_t>();
      if (row < 0 || row >= dataset_size)
        throw FormatError(file.string() + ": replay_buffer row " + std::to_string(row) +
                          " is outside the training set (" + std::to_string(dataset_size) + " rows)");
      r.indices.push_back(row);
    }
    r.epoch = e.at("epoch").get<int64_t>();
    r.times = e.at("times").get<int64_t>();
    r.origin = e.at("origin").get<std::string>();
    requeue_.push_back(std::move(r));
  }
}

}  // namespace hyflow::trainer
