#include <hyflow/serve/engine_loop.hpp>

#include <hyflow/serve/api_error.hpp>

#include <torch/torch.h>

#include <algorithm>

namespace hyflow::serve {

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

bool GenerationJob::push(int64_t sample, int64_t token, float log_prob, bool end) {
  std::lock_guard lk(mu_);
  const auto s = static_cast<size_t>(sample);
  const bool last = end || ++counts_[s] >= spec_.max_tokens || stopped_[s] || cancelled_;
  events_.push_back(TokenEvent{sample, token, log_prob, last});
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

namespace {

// Requests share a run when the engine would choose their tokens the same way.
bool same_sampling(const GenerationSpec& a, const GenerationSpec& b, uint64_t default_seed) {
  if (a.ignore_eos != b.ignore_eos) return false;
  if (a.sampling.is_greedy() || b.sampling.is_greedy()) return a.sampling.is_greedy() && b.sampling.is_greedy();
  return a.sampling.temperature == b.sampling.temperature && a.sampling.top_k == b.sampling.top_k &&
         a.sampling.top_p == b.sampling.top_p && a.sampling.min_p == b.sampling.min_p &&
         a.seed.value_or(default_seed) == b.seed.value_or(default_seed);
}

}  // namespace

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

int64_t EngineLoop::update_weights(const std::function<void(models::CausalLM&)>& update) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return update_ == nullptr || stopping_; });
  if (stopping_) throw Error("EngineLoop: update_weights while the loop is stopping");
  update_ = &update;
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
  return s;
}

void EngineLoop::main() {
  while (true) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return stopping_ || update_ != nullptr || !pending_.empty(); });
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
  GenerationSpec key;
  {
    std::lock_guard lk(mu_);
    if (pending_.empty()) return;
    key = pending_.front()->spec_;
    ++stats_.runs;
  }
  inference::DecodeSampling sampling;
  sampling.sampling = key.sampling;
  if (key.sampling.is_greedy()) sampling.sampling = cuda::SamplingOptions{.greedy = true};
  sampling.seed = key.seed.value_or(options_.seed);
  if (!key.ignore_eos) sampling.eos_token_ids = options_.eos_token_ids;
  sampling.return_log_probs = true;

  std::vector<Slot> slots;                           // output index -> job and sample
  std::vector<std::shared_ptr<GenerationJob>> jobs;  // admitted in this run
  int64_t admitted = 0;
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
      if (admitted >= options_.max_requests_per_run || !same_sampling(job->spec_, key, options_.seed)) {
        ++it;
        continue;
      }
      const auto& spec = job->spec_;
      inference::DecodeRequest r{.prompt = spec.prompt,
                                 .positions = {},
                                 .n = spec.n,
                                 .max_new_tokens = spec.max_tokens,
                                 .first_row_id = spec.seed ? 0 : static_cast<int64_t>(next_row_id_)};
      if (!spec.seed) next_row_id_ += static_cast<uint64_t>(spec.n);
      {
        std::lock_guard jl(job->mu_);
        job->version_ = version_;
      }
      for (int64_t j = 0; j < spec.n; ++j) slots.push_back(Slot{job, j});
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
    const auto& slot = slots[static_cast<size_t>(output)];
    const auto& ends = sampling.eos_token_ids;
    const bool eos = std::find(ends.begin(), ends.end(), token) != ends.end();
    ++tokens_;
    return slot.job->push(slot.sample, token, log_prob, eos || stopping_.load());
  };
  try {
    engine_.run({}, sampling, hooks);
  } catch (const std::exception& e) {
    for (const auto& job : jobs) {
      job->fail(std::string("the engine failed: ") + e.what());
    }
    return;
  }
  for (const auto& job : jobs) {
    job->fail("the engine ended its run before this request finished");
  }
}

}  // namespace hyflow::serve
