#include <hyflow/agents/token_generator.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/serve/engine_loop.hpp>

#include <algorithm>

namespace hyflow::agents {
namespace {

class EngineLoopGenerator final : public TokenGenerator {
 public:
  explicit EngineLoopGenerator(serve::EngineLoop& loop) : loop_(loop) {}

  TokenResult generate(const TokenRequest& request) override {
    serve::GenerationSpec spec;
    spec.prompt = request.prompt;
    spec.max_tokens = request.max_tokens;
    spec.sampling = cuda::SamplingOptions{.temperature = request.sampling.temperature,
                                          .top_k = request.sampling.top_k,
                                          .top_p = request.sampling.top_p,
                                          .min_p = request.sampling.min_p,
                                          .greedy = request.sampling.greedy};
    spec.seed = request.seed;
    auto job = loop_.submit(std::move(spec));
    const std::vector<serve::TokenEvent> events = job->wait_all();
    if (!job->error().empty()) throw ValueError("agent loop generation: " + job->error());
    TokenResult out;
    for (const auto& e : events) {
      out.ids.push_back(e.token);
      out.log_probs.push_back(e.log_prob);
    }
    const auto& eos = loop_.options().eos_token_ids;
    out.stopped = !out.ids.empty() && std::find(eos.begin(), eos.end(), out.ids.back()) != eos.end();
    return out;
  }

 private:
  serve::EngineLoop& loop_;
};

}  // namespace

std::unique_ptr<TokenGenerator> make_engine_loop_generator(serve::EngineLoop& loop) {
  return std::make_unique<EngineLoopGenerator>(loop);
}

}  // namespace hyflow::agents
