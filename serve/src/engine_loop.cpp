#include <hyflow/serve/engine_loop.hpp>

#include <hyflow/serve/api_error.hpp>

#include <torch/torch.h>

#include <algorithm>

namespace hyflow::serve {

WeightUpdateMode weight_update_mode_named(const std::string& name) {
  if (name == "drain") return WeightUpdateMode::kDrain;
  if (name == "partial") return WeightUpdateMode::kPartial;
  throw ValueError("the weight update mode must be 'drain' or 'partial', got '" + name + "'");
}

const char* weight_update_mode_name(WeightUpdateMode mode) {
  return mode == WeightUpdateMode::kPartial ? "partial" : "drain";
}

GenerationJob::GenerationJob(GenerationSpec spec)
    : spec_(std::move(spec)),
      counts_(static_cast<size_t>(spec_.n), 0),
      stopped_(static_cast<size_t>(spec_.n), 0),
      open_samples_(spec_.n) {}

bool GenerationJob::take(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !events_.empty() || done_; });
  const bool got = !events_.empty();
  out.insert(out.end(), events_.begin(), events_.end());
  events_.clear();
  return got || !done_;
}

std::vector<TokenEvent> GenerationJob::wait_all() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return done_; });
  std::vector<TokenEvent> out(events_.begin(), events_.end());
  events_.clear();
  return out;
}

void GenerationJob::stop_sample(int64_t sample) {
  std::lock_guard lk(mu_);
  if (sample >= 0 && sample < spec_.n) stopped_[static_cast<size_t>(sample)] = 1;
}

void GenerationJob::cancel() {
  std::lock_guard lk(mu_);
  cancelled_ = true;
}

bool GenerationJob::done() const {
  std::lock_guard lk(mu_);
  return done_;
}

bool GenerationJob::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

std::string GenerationJob::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

int64_t GenerationJob::weight_version() const {
  std::lock_guard lk(mu_);
  return version_;
}

bool GenerationJob::push(TokenEvent event, bool end) {
  std::lock_guard lk(mu_);
  const auto s = static_cast<size_t>(event.sample);
  const bool last = end || ++counts_[s] >= spec_.max_tokens || stopped_[s] || cancelled_;
  event.last = last;
  events_.push_back(std::move(event));
  if (last && --open_samples_ == 0) {
    done_ = true;
    if (on_done_) on_done_(cancelled_);
  }
  cv_.notify_all();
  return !last;
}

void GenerationJob::fail(const std::string& message) {
  std::lock_guard lk(mu_);
  if (done_) return;
  error_ = message;
  done_ = true;
  if (on_done_) on_done_(cancelled_);
  cv_.notify_all();
}

EngineLoop::EngineLoop(models::CausalLM model, inference::DecodeEngineOptions engine_options, EngineLoopOptions options)
    : model_(model), engine_(model_, engine_options), options_(std::move(options)) {
  vocab_ = model_->config().vocab_size;
  max_batch_ = engine_options.max_batch;
  if (max_batch_ <= 0) {
    throw ValueError("EngineLoop: the engine's max_batch must be > 0, got " + std::to_string(max_batch_));
  }
  if (options_.max_positions <= 1) {
    throw ValueError("EngineLoop: max_positions must be > 1, got " + std::to_string(options_.max_positions));
  }
  if (options_.max_in_flight <= 0 || options_.max_requests_per_run <= 0) {
    throw ValueError("EngineLoop: max_in_flight and max_requests_per_run must be > 0");
  }
  thread_ = std::thread([this] { main(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (auto& job : pending_) job->fail("the server is shutting down");
    pending_.clear();
  }
  cv_.notify_all();
  thread_.join();
  for (auto& slot : resumed_) slot.job->fail("the server is shutting down");
}

std::shared_ptr<GenerationJob> EngineLoop::submit(GenerationSpec spec) {
  if (spec.prompt.empty()) throw bad_request("prompt", "the prompt has no tokens");
  if (spec.n <= 0 || spec.n > max_batch_) {
    throw bad_request("n", "n must be in [1, " + std::to_string(max_batch_) + "], got " + std::to_string(spec.n));
  }
  if (spec.max_tokens <= 0) throw bad_request("max_tokens", "max_tokens must be > 0");
  const auto len = static_cast<int64_t>(spec.prompt.size());
  if (len + spec.max_tokens >= options_.max_positions) {
    throw bad_request("max_tokens", "the prompt's " + std::to_string(len) + " tokens + max_tokens " +
                                        std::to_string(spec.max_tokens) + " must stay below the server's " +
                                        std::to_string(options_.max_positions) + " positions");
  }
  for (auto id : spec.prompt) {
    if (id < 0 || id >= vocab_) {
      throw bad_request("prompt",
                        "token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab_));
    }
  }
  if (spec.top_logprobs < 0 || spec.top_logprobs > kMaxTopLogprobs) {
    throw bad_request("top_logprobs", "top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
                                          std::to_string(spec.top_logprobs));
  }
  if (spec.top_logprobs > 0 && engine_.backend() != inference::DecodeBackend::kKernels) {
    throw bad_request("top_logprobs", "top_logprobs are computed by the CPU kernels backend only, not this model's");
  }
  cuda::validate(spec.sampling);
  auto job = std::make_shared<GenerationJob>(std::move(spec));
  job->on_done_ = [this](bool cancelled) {
    --in_flight_;
    if (cancelled) ++cancelled_;
  };
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw ApiError(503, "server_error", "", "the server is shutting down");
    if (in_flight_.fetch_add(1) >= options_.max_in_flight) {
      --in_flight_;
      throw ApiError(429, "rate_limit_exceeded", "",
                     "too many requests in flight (" + std::to_string(options_.max_in_flight) + "); retry later");
    }
    pending_.push_back(job);
  }
  cv_.notify_all();
  return job;
}

int64_t EngineLoop::update_weights(const std::function<void(models::CausalLM&)>& update, WeightUpdateMode mode) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return update_ == nullptr || stopping_; });
  if (stopping_) throw Error("EngineLoop: update_weights while the loop is stopping");
  update_ = &update;
  update_mode_ = mode;
  const int64_t target = update_done_ + 1;
  update_error_ = nullptr;
  cv_.notify_all();
  cv_.wait(lk, [&] { return update_done_ >= target; });
  if (update_error_) std::rethrow_exception(update_error_);
  return version_;
}

void EngineLoop::free_cache() {
  const std::function<void(models::CausalLM&)> release = [this](models::CausalLM&) { engine_.free_cache(); };
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return update_ == nullptr || stopping_; });
  if (stopping_) throw Error("EngineLoop: free_cache while the loop is stopping");
  update_ = &release;
  update_mode_ = WeightUpdateMode::kDrain;  // freeing the cache waits for the running requests
  update_frees_cache_ = true;
  const int64_t target = update_done_ + 1;
  update_error_ = nullptr;
  cv_.notify_all();
  cv_.wait(lk, [&] { return update_done_ >= target; });
  update_frees_cache_ = false;
  if (update_error_) std::rethrow_exception(update_error_);
}

bool EngineLoop::updating_weights() const {
  std::lock_guard lk(mu_);
  return update_ != nullptr;
}

int64_t EngineLoop::weight_version() const {
  std::lock_guard lk(mu_);
  return version_;
}

EngineLoopStats EngineLoop::stats() const {
  std::lock_guard lk(mu_);
  auto s = stats_;
  s.tokens = tokens_.load();
  s.cancelled = cancelled_.load();
  s.queued = static_cast<int64_t>(pending_.size());
  return s;
}

void EngineLoop::main() {
  while (true) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return stopping_ || update_ != nullptr || !resumed_.empty() || !pending_.empty(); });
    if (stopping_) break;
    if (update_ != nullptr) {
      const auto* update = update_;
      lk.unlock();
      std::exception_ptr error;
      try {
        torch::NoGradGuard no_grad;
        (*update)(model_);
        if (!update_frees_cache_) engine_.drop_packed_weights();
      } catch (...) {
        error = std::current_exception();
      }
      lk.lock();
      update_error_ = error;
      if (!error && !update_frees_cache_) ++version_;
      update_ = nullptr;
      ++update_done_;
      cv_.notify_all();
      continue;
    }
    lk.unlock();
    run_once();
  }
}

void EngineLoop::run_once() {
  std::vector<Slot> slots;  // output index -> job and sample
  int64_t run_version = 0;
  {
    std::lock_guard lk(mu_);
    if (resumed_.empty() && pending_.empty()) return;
    slots.swap(resumed_);  // paused samples go first
    run_version = version_;
    ++stats_.runs;
  }
  // Each request brings its own sampling settings and seed (DecodeRequest::sampling, seed), so
  // every request shares the run; end tokens are checked in on_token (a request may ignore them).
  inference::DecodeSampling sampling;
  sampling.sampling = cuda::SamplingOptions{.greedy = true};
  sampling.return_log_probs = true;
  auto settings_of = [&](const GenerationSpec& spec, inference::DecodeRequest& r) {
    r.sampling = spec.sampling.is_greedy() ? cuda::SamplingOptions{.greedy = true} : spec.sampling;
    r.seed = spec.seed.value_or(options_.seed);
    r.top_logprobs = spec.top_logprobs;
  };

  std::vector<std::shared_ptr<GenerationJob>> jobs;  // admitted in this run
  std::vector<inference::DecodeRequest> resumes;     // a paused sample: prompt + its tokens, what is left
  for (auto& slot : slots) {
    const auto& spec = slot.job->spec_;
    auto prompt = spec.prompt;
    prompt.insert(prompt.end(), slot.tokens.begin(), slot.tokens.end());
    const auto done = static_cast<int64_t>(slot.tokens.size());
    inference::DecodeRequest r{.prompt = std::move(prompt),
                               .positions = {},
                               .n = 1,
                               .max_new_tokens = spec.max_tokens - done,
                               .first_row_id = slot.row_id,
                               .first_step = done};
    settings_of(spec, r);
    resumes.push_back(std::move(r));
    if (std::find(jobs.begin(), jobs.end(), slot.job) == jobs.end()) jobs.push_back(slot.job);
  }
  int64_t admitted = static_cast<int64_t>(jobs.size());
  bool paused = false;
  std::vector<inference::TokenLogProb> top;  // of the token on_token reports next
  inference::DecodeHooks hooks;
  hooks.reserve_positions = options_.max_positions;
  hooks.admit = [&] {
    std::vector<inference::DecodeRequest> out;
    std::lock_guard lk(mu_);
    if (stopping_ || update_ != nullptr || pending_.empty()) return out;
    int64_t live = 0;
    for (const auto& job : jobs) live += job->done() ? 0 : 1;
    for (auto it = pending_.begin(); it != pending_.end();) {
      const auto job = *it;
      if (job->cancelled()) {
        job->fail("cancelled");
        it = pending_.erase(it);
        continue;
      }
      if (admitted >= options_.max_requests_per_run) break;
      const auto& spec = job->spec_;
      inference::DecodeRequest r{.prompt = spec.prompt,
                                 .positions = {},
                                 .n = spec.n,
                                 .max_new_tokens = spec.max_tokens,
                                 .first_row_id = spec.seed ? 0 : static_cast<int64_t>(next_row_id_)};
      settings_of(spec, r);
      if (!spec.seed) next_row_id_ += static_cast<uint64_t>(spec.n);
      {
        std::lock_guard jl(job->mu_);
        job->version_ = version_;
      }
      for (int64_t j = 0; j < spec.n; ++j) slots.push_back(Slot{job, j, r.first_row_id + j, {}, true});
      jobs.push_back(job);
      if (live > 0) ++stats_.joined_mid_run;
      ++stats_.admitted;
      ++admitted;
      out.push_back(std::move(r));
      it = pending_.erase(it);
    }
    stats_.peak_running = std::max<int64_t>(stats_.peak_running, live + static_cast<int64_t>(out.size()));
    return out;
  };
  hooks.on_token = [&](int64_t output, int64_t token, float log_prob) {
    auto& slot = slots[static_cast<size_t>(output)];
    const auto& ends = options_.eos_token_ids;
    const bool eos = !slot.job->spec_.ignore_eos && std::find(ends.begin(), ends.end(), token) != ends.end();
    ++tokens_;
    slot.tokens.push_back(token);
    TokenEvent event{slot.sample, token, log_prob, false, run_version, {}};
    event.top.swap(top);
    slot.open = slot.job->push(std::move(event), eos || stopping_.load());
    return slot.open;
  };
  hooks.on_top_logprobs = [&](int64_t, const std::vector<inference::TokenLogProb>& alternatives) {
    top = alternatives;  // the next on_token's
  };
  // A partial weight update stops the run before its next step; the open samples resume after it.
  hooks.pause = [&] {
    std::lock_guard lk(mu_);
    paused = update_ != nullptr && update_mode_ == WeightUpdateMode::kPartial;
    return paused;
  };
  try {
    engine_.run(std::move(resumes), sampling, hooks);
  } catch (const std::exception& e) {
    for (const auto& job : jobs) {
      job->fail(std::string("the engine failed: ") + e.what());
    }
    return;
  }
  if (paused) {
    std::lock_guard lk(mu_);
    for (auto& slot : slots) {
      if (!slot.open) continue;
      if (slot.job->cancelled()) {
        slot.job->fail("cancelled");
      } else {
        resumed_.push_back(std::move(slot));
      }
    }
    return;
  }
  for (const auto& job : jobs) {
    job->fail("the engine ended its run before this request finished");
  }
}

}  // namespace hyflow::serve
