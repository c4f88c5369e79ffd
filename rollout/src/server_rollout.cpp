// The "server" rollout backend: a serve::EngineLoop + serve::Server per rank over the rank's
// model, and generate_sequences as concurrent token-id /v1/completions calls to it (cpp-httplib's
// client), whose answers are laid out as the "hf" backend lays out inference::generate's.
#include "server_rollout_backend.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/position_ids.hpp>
#include <hyflow/inference/rollout_batch.hpp>
#include <hyflow/metrics/server.hpp>
#include <hyflow/rollout/server_rollout.hpp>
#include <hyflow/serve/engine_loop.hpp>
#include <hyflow/serve/router.hpp>
#include <hyflow/serve/server.hpp>
#include <hyflow/tokenizers/tokenizer_dir.hpp>

#include <httplib.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

namespace hyflow::rollout {

void read_server_rollout_options(ConfigSection s, ServerRolloutOptions& o) {
  s.read("host", o.host, {.help = "server backend: address each rank's server binds (non-loopback needs token_file)"});
  s.read("port", o.port, {.help = "server backend: port of rank 0, rank r on port + r (0: free ports)", .minimum = 0});
  s.read("token_file", o.token_file, {.help = "server backend: file holding the bearer token of the servers"});
  s.read("max_in_flight", o.max_in_flight,
         {.help = "server backend: requests queued or running per server (and concurrent rollout requests)",
          .minimum = 1});
  s.read("timeout", o.timeout, {.help = "server backend: seconds one rollout request may take", .minimum = 0});
  s.read("tokenizer_path", o.tokenizer_path,
         {.help = "server backend: tokenizer folder of the served model (null: actor_rollout_ref.model.path)",
          .null_default = true});
  s.read("served_model_name", o.served_model_name, {.help = "server backend: the model id of /v1/models"});
  s.read(
      "router_port", o.router_port,
      {.help = "server backend: port of the trainer's router in front of the servers (0: a free port)", .minimum = 0});
  s.finish();
  if (s.describing()) return;
  if (o.router_port > 65535) throw ValueError("config key '" + s.key_path("router_port") + "' must be <= 65535");
  if (o.port > 65535) throw ValueError("config key '" + s.key_path("port") + "' must be <= 65535");
  if (!(o.timeout > 0)) throw ValueError("config key '" + s.key_path("timeout") + "' must be > 0");
}

struct RolloutRouter::Impl {
  explicit Impl(serve::RouterOptions options) : router(std::move(options)) {}
  serve::Router router;
};

RolloutRouter::RolloutRouter(const std::vector<std::string>& replica_urls, const ServerRolloutOptions& options) {
  serve::RouterOptions ro;
  ro.replicas = replica_urls;
  ro.host = options.host;
  ro.port = static_cast<int>(options.router_port);
  if (!options.token_file.empty()) ro.token = ro.replica_token = metrics::read_token_file(options.token_file);
  ro.max_in_flight = options.max_in_flight * static_cast<int64_t>(replica_urls.size());
  impl_ = std::make_unique<Impl>(std::move(ro));
}

RolloutRouter::~RolloutRouter() = default;

std::string RolloutRouter::base_url() const {
  return impl_->router.base_url();
}

ServerRolloutOptions server_rollout_options(const nlohmann::json& rollout_config) {
  ServerRolloutOptions o;
  const auto server = rollout_config.is_object() ? rollout_config.value("server", nlohmann::json()) : nlohmann::json();
  read_server_rollout_options(ConfigSection(server, "actor_rollout_ref.rollout.server"), o);
  return o;
}

namespace detail {
namespace {

using json = nlohmann::json;

int64_t int_or(const json& config, const char* key, int64_t fallback) {
  return config.is_object() && config.contains(key) && config.at(key).is_number_integer()
             ? config.at(key).get<int64_t>()
             : fallback;
}


class ServerRollout final : public RolloutBackend {
 public:
  explicit ServerRollout(const RolloutContext& context)
      : model_(context.model), options_(server_rollout_options(context.config)) {
    if (!model_) throw ValueError("rollout backend 'server': the rollout context has no model");
    if (options_.tokenizer_path.empty())
      throw ValueError(
          "rollout backend 'server': actor_rollout_ref.rollout.server.tokenizer_path is not set (the trainer sets it "
          "to actor_rollout_ref.model.path; a worker built by hand must set it)");
    tokenizer_ = tokenizers::read_tokenizer_dir(options_.tokenizer_path);
    const auto& c = context.config;
    // The rollout's positions: prompt + response (the trainer fills both from data.*), + 1 for the
    // engine's last-position bound; else the model's context.
    const int64_t prompt = int_or(c, "prompt_length", 0), response = int_or(c, "response_length", 0);
    const int64_t positions =
        prompt > 0 && response > 0 ? prompt + response + 1 : model_->config().max_position_embeddings;
    serve::EngineLoopOptions loop;
    loop.max_positions = positions;
    loop.max_in_flight = options_.max_in_flight;
    loop.eos_token_ids = model_->config().eos_token_ids;  // what "hf" stops at (GenerationOptions' default)
    loop.seed = static_cast<uint64_t>(int_or(c, "seed", 0) + context.rank);
    inference::DecodeEngineOptions engine;
    engine.max_batch = int_or(c, "max_num_seqs", 1024);
    engine.kv_cache_bytes = int_or(c, "kv_cache_bytes", 0);
    if (c.is_object() && c.contains("gpu_memory_utilization") && c.at("gpu_memory_utilization").is_number())
      engine.gpu_memory_utilization = c.at("gpu_memory_utilization").get<double>();
    loop_ = std::make_unique<serve::EngineLoop>(model_, engine, loop);

    serve::ServeOptions so;
    so.host = options_.host;
    so.port = options_.port == 0 ? 0 : static_cast<int>(options_.port + context.rank);
    if (!options_.token_file.empty()) so.token = metrics::read_token_file(options_.token_file);
    token_ = so.token;
    so.served_model_name = options_.served_model_name;
    so.limits.max_tokens = std::max<int64_t>(so.limits.max_tokens, positions);
    so.limits.max_prompt_tokens = std::max<size_t>(so.limits.max_prompt_tokens, static_cast<size_t>(positions));
    // a request carries a prompt's whole group (rollout.n rows repeated by the trainer)
    so.limits.max_n = std::max<int64_t>(so.limits.max_n, int_or(c, "n", 1));
    server_limit_n_ = std::min<int64_t>(so.limits.max_n, engine.max_batch);
    // a token-id prompt is about 8 bytes a token in JSON
    so.max_body_bytes = std::max<size_t>(so.max_body_bytes, static_cast<size_t>(positions) * 24);
    so.chat_stop = {"<|im_end|>"};
    // between the backend's calls the engine is parked (hold): outside clients get 503 + Retry-After
    so.reject_during_weight_update = true;
    server_ = std::make_unique<serve::Server>(*loop_, tokenizer_, so);
    hold();
  }

  ~ServerRollout() override {
    release();
    server_.reset();
    loop_.reset();
  }

  DataProto generate_sequences(const DataProto& prompts, const inference::GenerationOptions& options) override {
    for (const char* key : {"input_ids", "attention_mask"})
      if (!prompts.batch.contains(key))
        throw KeyError(std::string("rollout backend 'server': prompts need the tensor '") + key + "'");
    if (options.max_new_tokens <= 0 || options.n <= 0)
      throw ValueError("rollout backend 'server': max_new_tokens and n must be > 0");
    if (!options.eos_token_ids.empty() && options.eos_token_ids != loop_->options().eos_token_ids)
      throw ValueError(
          "rollout backend 'server': the server stops at the model's eos ids; a call with other "
          "eos_token_ids is not supported");
    const auto device = prompts.batch.at("input_ids").device();
    auto prompt_ids = prompts.batch.at("input_ids").to(at::kCPU, at::kLong).contiguous();
    auto prompt_mask = prompts.batch.at("attention_mask").to(at::kCPU, at::kLong).contiguous();
    if (prompt_ids.dim() != 2 || prompt_mask.sizes() != prompt_ids.sizes())
      throw ShapeError("rollout backend 'server': input_ids and attention_mask must both be (B, P)");
    auto prompt_pos = prompts.batch.contains("position_ids")
                          ? prompts.batch.at("position_ids").to(at::kCPU, at::kLong).contiguous()
                          : position_ids_from_mask(prompt_mask);
    const int64_t B = prompt_ids.size(0), P = prompt_ids.size(1), R = options.max_new_tokens, n = options.n;

    // Each row's real tokens; the server numbers them 0, 1, ... (a token-id prompt has no positions).
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
    auto ids_a = prompt_ids.accessor<int64_t, 2>();
    auto mask_a = prompt_mask.accessor<int64_t, 2>();
    auto pos_a = prompt_pos.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < P; ++t) {
        if (mask_a[b][t] == 0) continue;
        const auto expected = static_cast<int64_t>(rows[static_cast<size_t>(b)].size());
        if (pos_a[b][t] != expected)
          throw ValueError("rollout backend 'server': row " + std::to_string(b) + " has position id " +
                           std::to_string(pos_a[b][t]) + " at its token " + std::to_string(expected) +
                           "; a token-id prompt is numbered 0, 1, ... (left padding)");
        rows[static_cast<size_t>(b)].push_back(ids_a[b][t]);
      }
      if (rows[static_cast<size_t>(b)].empty())
        throw ValueError("rollout backend 'server': prompt row " + std::to_string(b) + " has no tokens");
    }

    Released open(*this);  // decoding is allowed while the call runs
    const auto samples = ask(rows, options);
    const int64_t pad_id = options.pad_token_id >= 0 ? options.pad_token_id : model_->config().resolved_pad_token_id();
    auto out = inference::rollout_batch_from_samples(prompts, prompt_ids, prompt_mask, prompt_pos, samples, n, R,
                                                     pad_id, options.return_log_probs);
    if (!device.is_cpu()) out.to(device);
    ++calls_;
    rows_ += B;
    return out;
  }

  void load_weights(const models::NamedTensors& weights, const std::string& source) override {
    Released open(*this);
    loop_->update_weights([&](models::CausalLM& m) { models::load_parameters(*m, weights, source); });
  }

  // Releasing the hold already drops the packed copies and moves the version (update_weights).
  void weights_changed() override { Released open(*this); }

  void free_cache_engine() override {
    Released open(*this);
    loop_->free_cache();
  }

  // Outside agents decode between the backend's calls until collect_sessions holds the engine again.
  std::string open_for_agents() override {
    if (!open_for_agents_) {
      release();
      open_for_agents_ = true;
    }
    return server_->base_url();
  }

  std::vector<DataProto> collect_sessions(const std::vector<std::string>& session_ids) override {
    if (open_for_agents_) {
      hold();  // drains: the turns of requests still running are recorded before they are taken
      open_for_agents_ = false;
    }
    std::vector<DataProto> out;
    for (const auto& id : session_ids)
      if (auto rows = server_->collect_session(id)) out.push_back(std::move(*rows));
    return out;
  }

  nlohmann::json stats() const override {
    const auto s = loop_->stats();
    return json{{"engine", true},
                {"server", true},
                {"base_url", server_->base_url()},
                {"weight_version", loop_->weight_version()},
                {"rollout_calls", calls_.load()},
                {"rollout_rows", rows_.load()},
                {"runs", s.runs},
                {"admitted", s.admitted},
                {"joined_mid_run", s.joined_mid_run},
                {"tokens", s.tokens},
                {"peak_running", s.peak_running}};
  }

 private:
  // One /v1/completions call per run of equal adjacent rows (the trainer repeats each prompt
  // rollout.n times, interleaved: one request of n x k samples then, so the group's samples are
  // distinct draws and share the prompt's prefill), max_in_flight calls at a time, so that they
  // share the engine's batch.
  // Every row's n samples, row after row (sample s of row b at b * n + s).
  std::vector<inference::DecodeOutput> ask(const std::vector<std::vector<int64_t>>& rows,
                                           const inference::GenerationOptions& o) {
    json base{{"max_tokens", o.max_new_tokens}, {"return_token_ids", true}, {"logprobs", 0}};
    if (!o.do_sample || o.sampling.is_greedy()) {
      base["temperature"] = 0;
    } else {
      base["temperature"] = o.sampling.temperature;
      base["top_p"] = o.sampling.top_p;
      base["top_k"] = o.sampling.top_k;
      base["min_p"] = o.sampling.min_p;
      // one seed for the call: its requests share a run, each request's samples are keyed (seed, sample, step)
      base["seed"] = static_cast<int64_t>(o.seed & 0x7fffffffffffffffULL);
    }
    struct Group {
      size_t first, rows;
    };
    std::vector<Group> groups;
    const auto max_rows = static_cast<size_t>(std::max<int64_t>(1, server_limit_n_ / o.n));
    for (size_t b = 0; b < rows.size(); ++b) {
      if (!groups.empty() && groups.back().rows < max_rows && rows[b] == rows[groups.back().first])
        ++groups.back().rows;
      else
        groups.push_back({b, 1});
    }
    std::vector<inference::DecodeOutput> out(rows.size() * static_cast<size_t>(o.n));
    std::atomic<size_t> next{0};
    std::mutex error_mu;
    std::string error;
    const auto workers = std::min<size_t>(groups.size(), static_cast<size_t>(options_.max_in_flight));
    std::vector<std::thread> threads;
    for (size_t w = 0; w < workers; ++w) {
      threads.emplace_back([&] {
        httplib::Client client(connect_host(), server_->port());
        const auto seconds = static_cast<time_t>(std::ceil(options_.timeout));
        client.set_read_timeout(seconds);
        client.set_write_timeout(seconds);
        httplib::Headers headers;
        if (!token_.empty()) headers.emplace("Authorization", "Bearer " + token_);
        for (size_t g; (g = next++) < groups.size();) {
          {
            std::lock_guard lk(error_mu);
            if (!error.empty()) return;
          }
          try {
            const auto& group = groups[g];
            const int64_t samples = o.n * static_cast<int64_t>(group.rows);
            // the group's rows are equal and adjacent: its samples fill their slots in order
            auto answer = ask_row(client, headers, base, rows[group.first], samples, group.first);
            std::move(answer.begin(), answer.end(), out.begin() + static_cast<std::ptrdiff_t>(group.first) * o.n);
          } catch (const std::exception& e) {
            std::lock_guard lk(error_mu);
            if (error.empty()) error = e.what();
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    if (!error.empty()) throw Error(error);
    return out;
  }

  std::vector<inference::DecodeOutput> ask_row(httplib::Client& client, const httplib::Headers& headers, json body,
                                               const std::vector<int64_t>& prompt, int64_t n, size_t row) const {
    body["prompt"] = prompt;
    body["n"] = n;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.timeout);
    const std::string what =
        "rollout backend 'server': prompt row " + std::to_string(row) + " at " + server_->base_url() + "/completions";
    while (true) {
      auto res = client.Post("/v1/completions", headers, body.dump(), "application/json");
      if (!res) throw Error(what + ": " + httplib::to_string(res.error()));
      if ((res->status == 429 || res->status == 503) && std::chrono::steady_clock::now() < deadline) {
        // busy (outside clients share the server) or a weight update: wait as told
        const int wait_s = std::max(1, std::atoi(res->get_header_value("Retry-After").c_str()));
        std::this_thread::sleep_for(std::chrono::seconds(wait_s));
        continue;
      }
      if (res->status != 200) throw Error(what + " answered HTTP " + std::to_string(res->status) + ": " + res->body);
      const auto answer = json::parse(res->body, nullptr, false);
      if (answer.is_discarded() || !answer.contains("choices") || answer.at("choices").size() != static_cast<size_t>(n))
        throw FormatError(what + ": the answer does not have " + std::to_string(n) + " choices: " + res->body);
      std::vector<inference::DecodeOutput> a(static_cast<size_t>(n));
      for (const auto& choice : answer.at("choices")) {
        const auto i = choice.at("index").get<size_t>();
        if (i >= static_cast<size_t>(n)) throw FormatError(what + ": a choice index " + std::to_string(i));
        a[i].tokens = choice.at("token_ids").get<std::vector<int64_t>>();
        for (const auto& lp : choice.at("logprobs").at("token_logprobs")) a[i].log_probs.push_back(lp.get<float>());
      }
      return a;
    }
  }

  // The hold: between the backend's calls the engine thread is parked inside a weight update, so
  // that nothing decodes while the trainer owns the weights (the optimizer writes them in place; a
  // sharded policy frees them): outside requests get 503 + Retry-After meanwhile. Releasing it
  // ends that update: the packed weight copies are dropped and the weight version goes up, since
  // the weights may have changed in between.
  void hold() {
    std::unique_lock lk(hold_mu_);
    held_ = true;
    parked_ = false;
    hold_thread_ = std::thread([this] {
      try {
        loop_->update_weights([this](models::CausalLM&) {
          std::unique_lock hl(hold_mu_);
          parked_ = true;
          hold_cv_.notify_all();
          hold_cv_.wait(hl, [&] { return !held_; });
        });
      } catch (const std::exception&) {  // the loop is stopping: nothing is held
        std::lock_guard hl(hold_mu_);
        parked_ = true;
        hold_cv_.notify_all();
      }
    });
    hold_cv_.wait(lk, [&] { return parked_; });
  }
  void release() {
    {
      std::lock_guard lk(hold_mu_);
      held_ = false;
    }
    hold_cv_.notify_all();
    if (hold_thread_.joinable()) hold_thread_.join();
  }
  // Released for one call of the backend, held again after it (also when it throws).
  struct Released {
    ServerRollout& self;
    explicit Released(ServerRollout& s) : self(s) { self.release(); }
    ~Released() {
      self.hold();
      self.open_for_agents_ = false;  // a call while open for agents ends that too
    }
    Released(const Released&) = delete;
    Released& operator=(const Released&) = delete;
  };

  // Where this process reaches its own server: the bound address, loopback for a wildcard bind.
  std::string connect_host() const {
    const auto& h = options_.host;
    return h == "0.0.0.0" || h == "::" || h.empty() ? std::string("127.0.0.1") : h;
  }

  models::CausalLM model_;
  ServerRolloutOptions options_;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer_;
  std::string token_;
  std::unique_ptr<serve::EngineLoop> loop_;
  std::unique_ptr<serve::Server> server_;
  std::atomic<int64_t> calls_{0}, rows_{0};
  std::mutex hold_mu_;
  std::condition_variable hold_cv_;
  bool held_ = false, parked_ = false;
  bool open_for_agents_ = false;  // released by open_for_agents, held again by collect_sessions
  std::thread hold_thread_;
  int64_t server_limit_n_ = 1;  // most samples one request may ask (the server's n bound, the engine's batch)
};

}  // namespace

std::unique_ptr<RolloutBackend> make_server_rollout(const RolloutContext& context) {
  return std::make_unique<ServerRollout>(context);
}

}  // namespace detail
}  // namespace hyflow::rollout
