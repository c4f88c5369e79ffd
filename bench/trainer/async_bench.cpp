// Synchronous vs asynchronous training (trainer.v1.trainer_mode) on the main job's configuration
// (config/grpo_arithmetic.ini), all in one run on the same model and data: time per step and
// tokens/s of one-step-off and of bounded staleness (K = 2), with rollout and training on separate
// ranks (1 trainer worker, 1 rollout worker), against the synchronous loop on the same separate
// ranks (threshold 0 with the wait strategy: generate, then train, no overlap). The colocated sync
// loop of the main job (2 workers doing both) and colocate_async (the same 2 workers, the next batch
// generating while the controller scores and prepares this one) are reported against the same peer. The modes take
// turns for 3 rounds and each reports its median round, since the machine's load drifts.
// With CURVE_STEPS, every mode then trains CURVE_STEPS steps with greedy validation every 50
// steps, and the validation accuracy of each mode is printed against the sync loop's at the same
// step.
// Usage: async_bench [MODEL_DIR [STEPS [CURVE_STEPS]]]   (MODEL_DIR: the SFT-warmed model of the
// main job; without it the bench first runs the main job's SFT warm-up, config/sft_arithmetic.ini)
#include "bench_json.hpp"

#include <hyflow/trainer/ppo_trainer.hpp>
#include <hyflow/trainer/sft_trainer.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <unistd.h>

using namespace hyflow::trainer;
namespace fs = std::filesystem;

namespace {
struct Mode {
  std::string name;
  std::vector<std::string> args;
};

std::vector<std::string> separate(int64_t warmup_batches, int64_t threshold, const std::string& strategy) {
  return {"--trainer.v1.trainer_mode=separate_async", "--trainer.n_gpus_per_node=1",
          "--actor_rollout_ref.rollout.n_gpus_per_node=1",
          "--trainer.v1.separate_async.num_warmup_batches=" + std::to_string(warmup_batches),
          "--trainer.v1.sampler.max_off_policy_threshold=" + std::to_string(threshold),
          "--trainer.v1.sampler.max_off_policy_strategy=" + strategy};
}

std::vector<nlohmann::json> train(const std::string& model, const fs::path& dir, const Mode& mode, int64_t steps,
                                  int64_t test_freq) {
  Config c;
  std::vector<std::string> args = {std::string("--config=") + HYFLOW_TRAINER_CONFIG,
                                   "--actor_rollout_ref.model.path=" + model,
                                   "--trainer.total_training_steps=" + std::to_string(steps),
                                   "--trainer.test_freq=" + std::to_string(test_freq),
                                   "--trainer.val_before_train=" + std::string(test_freq > 0 ? "true" : "false"),
                                   "--trainer.logger=['jsonl']",
                                   "--trainer.default_local_dir=" + (dir / mode.name).string()};
  args.insert(args.end(), mode.args.begin(), mode.args.end());
  c.apply_arguments(args);
  std::streambuf* out = std::cout.rdbuf(std::cerr.rdbuf());  // stdout carries only JSON lines
  PPOTrainer trainer(c);
  trainer.init_workers();
  trainer.fit();
  std::cout.rdbuf(out);
  return trainer.history();
}

/// Mean step time and tokens/s over the steps after the first two (pipeline filled, caches warm).
std::pair<double, double> speed(const std::vector<nlohmann::json>& h) {
  double time = 0, tokens = 0;
  for (size_t i = 2; i < h.size(); ++i) {
    time += h[i].at("timing_s/step").get<double>();
    tokens += h[i].at("perf/total_num_tokens").get<double>();
  }
  return {time / static_cast<double>(h.size() - 2), tokens / time};
}

std::map<int64_t, double> accuracy(const std::vector<nlohmann::json>& h) {
  std::map<int64_t, double> acc;
  for (const auto& m : h)
    for (const auto& [k, v] : m.items())
      if (k.rfind("val-core/", 0) == 0) acc[m.at("step").get<int64_t>()] = v.get<double>();
  return acc;
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 12;
  const int64_t curve_steps = argc > 3 ? std::stoll(argv[3]) : 0;
  if (steps < 3) {
    std::cerr << "async_bench: STEPS must be >= 3 (the first two are not timed)\n";
    return 2;
  }
  const fs::path tmp = fs::temp_directory_path() / ("hyflow_async_bench_" + std::to_string(::getpid()));
  std::string model = argc > 1 ? argv[1] : "";
  if (model.empty()) {
    Config sft(ConfigSchema::sft);
    sft.apply_arguments(
        {std::string("--config=") + HYFLOW_SFT_CONFIG, "--trainer.default_local_dir=" + (tmp / "sft").string()});
    std::cerr << "async_bench: no MODEL_DIR given, warming up the built-in model (" << HYFLOW_SFT_CONFIG << ")\n";
    std::streambuf* out = std::cout.rdbuf(std::cerr.rdbuf());
    (void)run_sft(sft);
    std::cout.rdbuf(out);
    model = (tmp / "sft").string();
  }
  const std::vector<Mode> modes = {
      {"sync (separate ranks)", separate(1, 0, "wait")},
      {"one-step-off", separate(1, 1, "wait")},
      {"bounded staleness K=2", separate(2, 2, "wait")},
      {"sync (colocated, 2 workers)", {}},
      {"colocate_async one-step-off (2 workers)",
       {"--trainer.v1.trainer_mode=colocate_async", "--trainer.v1.colocate_async.num_warmup_batches=1",
        "--trainer.v1.sampler.max_off_policy_threshold=1", "--trainer.v1.sampler.max_off_policy_strategy=wait"}},
  };
  const std::string peer = "hyflow sync loop, separate ranks";
  // The machine's load drifts: the modes take turns, 3 rounds, and each keeps its median round.
  constexpr int kRounds = 3;
  std::vector<std::vector<std::pair<double, double>>> rounds(modes.size());
  for (int r = 0; r < kRounds; ++r)
    for (size_t i = 0; i < modes.size(); ++i) rounds[i].push_back(speed(train(model, tmp, modes[i], steps, -1)));
  std::vector<std::pair<double, double>> speeds;
  for (auto& per_round : rounds) {
    std::sort(per_round.begin(), per_round.end());  // by step time
    speeds.push_back(per_round[kRounds / 2]);
  }
  for (size_t i = 0; i < modes.size(); ++i) {
    const auto& [step_s, tokens_s] = speeds[i];
    hyflow_bench::emit("async_rl", modes[i].name + ": time per step", step_s, "s", peer, speeds[0].first,
                       speeds[0].first / step_s);
    hyflow_bench::emit("async_rl", modes[i].name + ": throughput", tokens_s, "tokens/s", peer, speeds[0].second,
                       tokens_s / speeds[0].second);
  }
  if (curve_steps > 0) {
    std::vector<std::map<int64_t, double>> curves;
    for (const auto& mode : modes) curves.push_back(accuracy(train(model, tmp, mode, curve_steps, 50)));
    for (size_t i = 0; i < modes.size(); ++i)
      for (const auto& [step, acc] : curves[i]) {
        const double sync_acc = curves[0].at(step);
        hyflow_bench::emit("async_rl_curve", modes[i].name + ": greedy val accuracy at step " + std::to_string(step),
                           acc, "accuracy", peer, sync_acc, sync_acc > 0 ? acc / sync_acc : 0);
      }
  }
  fs::remove_all(tmp);
  return 0;
}
