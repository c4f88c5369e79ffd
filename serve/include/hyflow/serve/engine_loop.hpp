#pragma once
// EngineLoop: one thread that owns a DecodeEngine and serves every client from it (continuous
// batching across requests). A submitted request waits in a queue; the engine thread runs the
// engine and, before every step, admits the queued requests (DecodeHooks::admit), each with its
// own sampling settings, seed and end-token rule (DecodeRequest::sampling, seed), so concurrent
// clients share the batch whatever they ask and a request that arrives mid-run joins at the next
// step. Tokens reach the request's GenerationJob as they are chosen; a cancelled job (a client
// gone mid-stream) leaves the batch at the next step. A run admits at most max_requests_per_run,
// then drains and frees its outputs. Weight updates drain the running requests (or,
// in partial mode, pause them at the next step and resume them on the new weights), replace the
// weights on the engine thread and bump the weight version; requests wait meanwhile.

#include <hyflow/cuda/sampling.hpp>
#include <hyflow/inference/decode_engine.hpp>
#include <hyflow/models/llama.hpp>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace hyflow::serve {

struct EngineLoopOptions {
  /// Positions (prompt + max_tokens) a request may reach; the KV pool of each run is sized for
  /// the engine's max_batch sequences of this length (DecodeHooks::reserve_positions).
  int64_t max_positions = 1024;
  int64_t max_in_flight = 64;           ///< requests queued or running; submit() beyond is an ApiError 429
  int64_t max_requests_per_run = 4096;  ///< then the run stops admitting, drains and frees its outputs
  std::vector<int64_t> eos_token_ids;   ///< a sample stops after one of these
  uint64_t seed = 0;                    ///< the seed of requests that bring none
};

/// The most alternatives a token may come with (OpenAI's bound of top_logprobs).
inline constexpr int64_t kMaxTopLogprobs = 20;

/// What one request asks of the engine.
struct GenerationSpec {
  std::vector<int64_t> prompt;
  int64_t n = 1;
  int64_t max_tokens = 16;
  cuda::SamplingOptions sampling;
  std::optional<uint64_t> seed;  ///< set: the tokens depend on (seed, sample, step) only, as alone
  bool ignore_eos = false;       ///< end tokens do not stop a sample
  int64_t top_logprobs = 0;      ///< > 0: each TokenEvent carries this many most likely alternatives
};

/// How EngineLoop::update_weights treats the requests running when it is called.
enum class WeightUpdateMode {
  kDrain,    ///< they finish on the weights they started with; then the weights change
  kPartial,  ///< verl's partial rollout: they stop at the next step, keep their tokens and go on
             ///< from there on the new weights (their later tokens carry the new version)
};

/// "drain" or "partial" (the names of the hyflow-serve flag and of the weights endpoint).
WeightUpdateMode weight_update_mode_named(const std::string& name);
const char* weight_update_mode_name(WeightUpdateMode mode);

/// One chosen token of one sample; `last` marks the sample's final token.
struct TokenEvent {
  int64_t sample = 0;
  int64_t token = 0;
  float log_prob = 0.0F;
  bool last = false;
  int64_t weight_version = 0;                ///< the weights that chose it
  std::vector<inference::TokenLogProb> top;  ///< GenerationSpec::top_logprobs most likely tokens, best first
};

/// The consumer's side of a submitted request; shared by the HTTP thread and the engine thread.
class GenerationJob {
 public:
  explicit GenerationJob(GenerationSpec spec);
  /// Moves the events that arrived into `out`, waiting up to `timeout` for the first one.
  /// Returns false once the job is over and nothing is left to take.
  bool take(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout);
  /// Blocks until every sample ended (or the run failed), then returns all events not yet taken.
  std::vector<TokenEvent> wait_all();
  /// Ends one sample (a stop string matched) or all of them: they leave the batch at the next step.
  void stop_sample(int64_t sample);
  void cancel();
  bool done() const;
  bool cancelled() const;
  /// Non-empty when the run failed (the engine's message).
  std::string error() const;
  /// The weight version of the job's first tokens (set when the job is admitted); a partial
  /// weight update gives its later tokens newer versions (TokenEvent::weight_version).
  int64_t weight_version() const;
  const GenerationSpec& spec() const { return spec_; }

 private:
  friend class EngineLoop;
  // Engine side, under mu_: records a token; true while the sample goes on.
  bool push(TokenEvent event, bool end);
  void fail(const std::string& message);

  GenerationSpec spec_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  std::vector<int64_t> counts_;
  std::vector<char> stopped_;
  int64_t open_samples_ = 0;
  bool done_ = false;
  bool cancelled_ = false;
  std::string error_;
  int64_t version_ = 0;
  std::function<void(bool cancelled)> on_done_;  // the loop's in-flight count, called once under mu_
};

/// What the loop did so far.
struct EngineLoopStats {
  int64_t runs = 0;
  int64_t admitted = 0;        ///< requests handed to the engine
  int64_t joined_mid_run = 0;  ///< of those, admitted while other requests were decoding
  int64_t cancelled = 0;       ///< jobs cancelled before they finished
  int64_t tokens = 0;          ///< tokens delivered
  int64_t peak_running = 0;    ///< most requests in one run at once
  int64_t queued = 0;          ///< submitted requests waiting for admission now
};

class EngineLoop {
 public:
  /// Starts the engine thread. The engine decodes `model` (which the loop holds; update_weights
  /// is the only safe way to change it while the loop runs).
  EngineLoop(models::CausalLM model, inference::DecodeEngineOptions engine_options, EngineLoopOptions options);
  /// Fails the queued jobs, cancels the running ones and joins the thread.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  /// Queues a request. ApiError 429 when max_in_flight requests are queued or running, 400 when
  /// prompt + max_tokens exceed max_positions or n the engine's max_batch, or a token id is
  /// outside the vocabulary.
  std::shared_ptr<GenerationJob> submit(GenerationSpec spec);

  /// Admission pauses and the running requests finish (kDrain) or stop at the next step
  /// (kPartial); then `update` runs on the engine thread (no run in progress), the packed weight
  /// copies are dropped and the weight version goes up by one (returned). Requests submitted
  /// meanwhile wait and run on the new weights; paused ones resume first, from their prompt and
  /// the tokens they had (seeded ones at the same sampling steps, so they stay a function of
  /// (seed, sample, step)), for what is left of their max_tokens. When `update` throws, nothing
  /// changed version and the exception comes back here (paused requests resume all the same).
  int64_t update_weights(const std::function<void(models::CausalLM&)>& update,
                         WeightUpdateMode mode = WeightUpdateMode::kDrain);
  /// Whether a weight update is waiting for the drain or running.
  bool updating_weights() const;
  int64_t weight_version() const;
  EngineLoopStats stats() const;
  const EngineLoopOptions& options() const { return options_; }
  int64_t vocab_size() const { return vocab_; }
  /// verl's free_cache_engine: drains as update_weights does, then releases the engine's KV pool
  /// and scratch on the engine thread (DecodeEngine::free_cache); the weights and their version stay.
  void free_cache();

 private:
  struct Slot {
    std::shared_ptr<GenerationJob> job;
    int64_t sample;
    int64_t row_id;               // the sample's sampling row (seeded: its index)
    std::vector<int64_t> tokens;  // chosen so far, earlier runs included
    bool open = true;             // not yet ended
  };
  void main();
  void run_once();

  models::CausalLM model_;
  inference::DecodeEngine engine_;
  EngineLoopOptions options_;
  int64_t vocab_ = 0;
  int64_t max_batch_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GenerationJob>> pending_;
  std::vector<Slot> resumed_;          // samples a partial weight update paused; admitted before pending_
  std::atomic<int64_t> in_flight_{0};  // submitted and not done (a job's on_done_ lowers it)
  std::atomic<int64_t> cancelled_{0};
  std::atomic<bool> stopping_{false};  // set under mu_; the engine thread also reads it per token
  std::atomic<int64_t> tokens_{0};
  std::exception_ptr update_error_;
  const std::function<void(models::CausalLM&)>* update_ = nullptr;  // the waiting weight update
  WeightUpdateMode update_mode_ = WeightUpdateMode::kDrain;
  int64_t update_done_ = 0;                                         // updates applied
  bool update_frees_cache_ = false;  // the waiting "update" is free_cache: no version bump, packed weights kept
  int64_t version_ = 0;
  uint64_t next_row_id_ = 0;
  EngineLoopStats stats_;
  std::thread thread_;
};

}  // namespace hyflow::serve
