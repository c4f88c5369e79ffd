// serve_bench [max_tokens [stream_interval_ms]]: the rollout server (hyflow::serve over loopback HTTP, streaming)
// against its own engine called directly. Figures (bench/README.md):
//   serve_throughput  1/8/32 clients   aggregate tokens/s of K concurrent streaming clients vs
//                                      (median of 5 rounds, each pairing the two back to back)
//                                      DecodeEngine::run on the same K prompts in one batch
//   serve_ttft        K clients p50/p99  time to the first token, peer: one engine step's time
//   serve_itl         K clients p50/p99  time between a client's chunks, peer: one engine step's time
//   serve_http_overhead                  µs a request spends in HTTP (max_tokens 1 over HTTP
//                                        minus EngineLoop::submit directly), median of 200
// The model: models::tiny_config (d=128, 4 layers) over a printable-ASCII character tokenizer,
// greedy, every request max_tokens new tokens (no end token: ignore_eos by an empty eos list).
// Both paths run their engine on a thread of their own; figures on a shared machine are noisy:
// bench/README.md gives the spread of several runs.
#include "bench_json.hpp"

#include <hyflow/models/config.hpp>
#include <hyflow/serve/server.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>

#include <httplib.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <latch>

using namespace hyflow;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRounds = 5;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// The number of ids in a chunk's "token_ids":[...] (a load generator's client: the clients share
// the machine's cores with the server, so they do no more than this per event).
int64_t token_ids_in(const std::string& event) {
  static const std::string key = "\"token_ids\":[";
  const auto at = event.find(key);
  if (at == std::string::npos) return 0;
  const auto from = at + key.size(), to = event.find(']', from);
  if (to == from) return 0;
  return 1 + std::count(event.begin() + static_cast<std::ptrdiff_t>(from),
                        event.begin() + static_cast<std::ptrdiff_t>(to), ',');
}

struct ClientResult {
  int64_t tokens = 0;
  double ttft = 0.0;
  std::vector<double> gaps;  // between chunks that carried tokens
};

ClientResult stream_one(int port, const std::vector<int64_t>& prompt, int64_t max_tokens) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300);
  const nlohmann::json body{
      {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", true}, {"return_token_ids", true}};
  ClientResult r;
  const auto t0 = Clock::now();
  auto last = t0;
  std::string buffer;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const auto event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: {", 0) != 0) continue;
      const auto got = token_ids_in(event);
      if (got == 0) continue;
      const auto now = Clock::now();
      if (r.tokens == 0) {
        r.ttft = std::chrono::duration<double>(now - t0).count();
      } else {
        r.gaps.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
      r.tokens += got;
    }
    return true;
  };
  c.send(req);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t max_tokens = argc > 1 ? std::stoll(argv[1]) : 128;
  const int stream_interval_ms = argc > 2 ? std::stoi(argv[2]) : 0;
  tokenizers::CharTokenizerOptions o;
  o.alphabet.clear();
  for (char c = ' '; c <= '~'; ++c) o.alphabet.push_back(c);
  auto tokenizer = std::make_shared<tokenizers::CharTokenizer>(o);
  torch::manual_seed(0);
  models::CausalLM model(models::tiny_config(tokenizer->vocab_size(), 0, 2));
  model->eval();
  std::vector<std::vector<int64_t>> prompts;
  for (int i = 0; i < 32; ++i) {
    prompts.push_back(tokenizer->encode("prompt " + std::to_string(i) + ": 12+" + std::to_string(i) + "="));
  }

  serve::EngineLoopOptions loop_options;
  loop_options.max_positions = 64 + max_tokens;
  loop_options.eos_token_ids = {};  // every request runs max_tokens, in both paths
  serve::EngineLoop loop(model, {.max_batch = 32}, loop_options);
  serve::ServeOptions options;
  options.stream_interval_ms = stream_interval_ms;
  serve::Server server(loop, tokenizer, options);
  inference::DecodeEngine direct(model, {.max_batch = 32});
  inference::DecodeSampling greedy;
  greedy.sampling.greedy = true;

  for (int clients : {1, 8, 32}) {
    std::vector<inference::DecodeRequest> reqs;
    for (int i = 0; i < clients; ++i) {
      reqs.push_back({.prompt = prompts[static_cast<size_t>(i)],
                      .positions = {},
                      .n = 1,
                      .max_new_tokens = max_tokens,
                      .first_row_id = 0});
    }
    // Rounds of (engine alone, then the server), each ratio taken within its round; the median
    // round is reported (the machine is shared: back-to-back pairs see the same load).
    struct Round {
      double direct_tps, served_tps, step_s;
      std::vector<double> ttft, gaps;
    };
    std::vector<Round> rounds;
    for (int round = 0; round < kRounds; ++round) {
      Round r{};
      // On a thread of its own, as the loop runs its engine (LibTorch's intra-op threads are set
      // up per calling thread), after a warm-up run (packed weights, KV pool).
      const double direct_s = std::async(std::launch::async, [&] {
                                direct.run(reqs, greedy);
                                const auto start = Clock::now();
                                direct.run(reqs, greedy);
                                return seconds_since(start);
                              }).get();
      r.direct_tps = static_cast<double>(clients * max_tokens) / direct_s;
      r.step_s = direct_s / static_cast<double>(direct.stats().steps);

      stream_one(server.port(), prompts[0], 4);  // warm the loop's engine
      std::latch start(clients + 1);
      std::vector<std::future<ClientResult>> futures;
      for (int i = 0; i < clients; ++i) {
        futures.push_back(std::async(std::launch::async, [&, i] {
          start.arrive_and_wait();
          return stream_one(server.port(), prompts[static_cast<size_t>(i)], max_tokens);
        }));
      }
      start.arrive_and_wait();
      const auto t0 = Clock::now();
      int64_t tokens = 0;
      for (auto& f : futures) {
        auto c = f.get();
        tokens += c.tokens;
        r.ttft.push_back(c.ttft);
        r.gaps.insert(r.gaps.end(), c.gaps.begin(), c.gaps.end());
      }
      r.served_tps = static_cast<double>(tokens) / seconds_since(t0);
      rounds.push_back(std::move(r));
    }
    std::sort(rounds.begin(), rounds.end(),
              [](const Round& a, const Round& b) { return a.served_tps / a.direct_tps < b.served_tps / b.direct_tps; });
    const auto& median = rounds[rounds.size() / 2];
    const double served_tps = median.served_tps, direct_tps = median.direct_tps, step_s = median.step_s;
    const auto& ttft = median.ttft;
    const auto& gaps = median.gaps;
    auto name = std::to_string(clients) + " clients";
    if (stream_interval_ms > 0) name += ", stream interval " + std::to_string(stream_interval_ms) + " ms";
    hyflow_bench::emit("serve_throughput", name + ", " + std::to_string(max_tokens) + " tokens each", served_tps,
                       "tokens/s", "DecodeEngine::run, one batch", direct_tps, served_tps / direct_tps);
    for (double q : {0.5, 0.99}) {
      const auto tag = q == 0.5 ? std::string("p50") : std::string("p99");
      const double t = percentile(ttft, q) * 1e3, g = percentile(gaps, q) * 1e3;
      hyflow_bench::emit("serve_ttft", name + " " + tag, t, "ms", "one engine step", step_s * 1e3, step_s * 1e3 / t);
      hyflow_bench::emit("serve_itl", name + " " + tag, g, "ms", "one engine step", step_s * 1e3, step_s * 1e3 / g);
    }
  }

  // The HTTP layer's cost of one request: max_tokens 1 over HTTP vs submit() directly.
  std::vector<double> http_us, direct_us;
  httplib::Client c("127.0.0.1", server.port());
  const nlohmann::json body{{"prompt", prompts[0]}, {"max_tokens", 1}, {"temperature", 0}};
  for (int i = 0; i < 200; ++i) {
    auto t0 = Clock::now();
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    if (!res || res->status != 200) return 1;
    http_us.push_back(seconds_since(t0) * 1e6);
    t0 = Clock::now();
    loop.submit({.prompt = prompts[0], .n = 1, .max_tokens = 1, .sampling = {.greedy = true}, .seed = {}})->wait_all();
    direct_us.push_back(seconds_since(t0) * 1e6);
  }
  const double http = percentile(http_us, 0.5), engine = percentile(direct_us, 0.5);
  hyflow_bench::emit("serve_http_overhead", "max_tokens 1, keep-alive, median of 200", http - engine, "us",
                     "EngineLoop::submit (no HTTP)", engine, engine / http);
  return 0;
}
