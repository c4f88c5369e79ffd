// The built-in "hf" rollout backend: inference::generate on the served model with a long-lived
// DecodeEngine (its KV pool, scratch and, for float32 CPU models, packed weights kept between
// calls; free_cache_engine releases the pool and the scratch), the reference generation path
// where the engine does not apply.
#include "decode_rollout.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/inference/decode_engine.hpp>

namespace hyflow::rollout::detail {
namespace {

class DecodeRollout final : public RolloutBackend {
 public:
  explicit DecodeRollout(models::CausalLM model) : model_(std::move(model)) {
    if (!model_) throw ValueError("rollout backend 'hf': the rollout context has no model");
  }

  DataProto generate_sequences(const DataProto& prompts, const inference::GenerationOptions& options) override {
    // Built at the first call that can use it with that call's options.decode (the worker's are
    // the same every call); its KV pool is released by free_cache_engine and remade by the next run.
    if (!engine_ && options.engine == inference::GenerationEngine::kDecode && inference::DecodeEngine::supports(model_))
      engine_ = std::make_unique<inference::DecodeEngine>(model_, options.decode);
    return engine_ ? inference::generate(model_, prompts, options, *engine_)
                   : inference::generate(model_, prompts, options);
  }

  void load_weights(const models::NamedTensors& weights, const std::string& source) override {
    models::load_parameters(*model_, weights, source);
    // load_parameters copies in place (version counters bumped, so the engine would repack the
    // changed weights by itself); every weight changes here anyway, and dropping does not depend
    // on how the weights were written.
    weights_changed();
  }

  void weights_changed() override {
    if (engine_) engine_->drop_packed_weights();
  }

  // verl's free_cache_engine: the KV pool and the scratch go; the packed weights stay (a sharded
  // policy has none between rollouts: the worker calls weights_changed after its gather).
  void free_cache_engine() override {
    if (engine_) engine_->free_cache();
  }

  nlohmann::json stats() const override {
    if (!engine_) return nlohmann::json{{"engine", false}};
    const auto& s = engine_->stats();
    return nlohmann::json{{"engine", true},
                          {"packed_weights", s.packed_weights},
                          {"pack_s", s.pack_s},
                          {"packed_bytes", engine_->packed_bytes()},
                          {"steps", s.steps},
                          {"kv_pool_bytes", engine_->kv_pool_bytes()},
                          {"kv_pool_blocks", s.kv_pool_blocks},
                          {"kv_block_bytes", s.kv_block_bytes},
                          {"peak_kv_blocks", s.peak_kv_blocks}};
  }

 private:
  models::CausalLM model_;
  std::unique_ptr<inference::DecodeEngine> engine_;
};

}  // namespace

std::unique_ptr<RolloutBackend> make_decode_rollout(const RolloutContext& context) {
  return std::make_unique<DecodeRollout>(context.model);
}

}  // namespace hyflow::rollout::detail
