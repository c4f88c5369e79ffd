#pragma once
// The token-in / token-out engine an agent loop samples from: one call continues one sample's
// ids by at most max_tokens sampled ids. Thread-safe: the loops of many samples call it at once
// and a good implementation batches them (EngineLoopGenerator shares one serve::EngineLoop, so
// a sample waiting on a slow tool leaves the batch and the others keep decoding).

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace hyflow::serve {
class EngineLoop;
}

namespace hyflow::agents {

/// Sampling settings of one call (cuda::SamplingOptions' fields, without its torch headers).
struct TokenSampling {
  bool greedy = false;
  double temperature = 1.0;
  int64_t top_k = -1;
  double top_p = 1.0;
  double min_p = 0.0;
};

struct TokenRequest {
  std::vector<int64_t> prompt;  ///< the whole conversation so far, as ids
  int64_t max_tokens = 16;      ///< >= 1
  TokenSampling sampling;
  std::optional<uint64_t> seed;  ///< set: the ids depend on (seed, step) only
};

struct TokenResult {
  std::vector<int64_t> ids;      ///< the sampled ids, the end token included when one was sampled
  std::vector<float> log_probs;  ///< the engine's log-probability of each sampled id
  bool stopped = false;          ///< true: ended on an end token; false: max_tokens reached
};

class TokenGenerator {
 public:
  virtual ~TokenGenerator() = default;
  /// Blocks until the sample ends. An engine failure is a hyflow::Error naming it.
  virtual TokenResult generate(const TokenRequest& request) = 0;
};

/// Submits to a serve::EngineLoop (which must outlive it); its end tokens are the loop's eos_token_ids.
std::unique_ptr<TokenGenerator> make_engine_loop_generator(serve::EngineLoop& loop);

}  // namespace hyflow::agents
