// GRPO step of the main job's configuration (config/grpo_arithmetic.ini): hyflow's step time
// breakdown (timing_s/*) and throughput against a PyTorch implementation of the same step on
// the same model and prompts (grpo_step_peer.py), measured in the same run.
// Usage: trainer_bench [MODEL_DIR [STEPS]]   (MODEL_DIR: the SFT-warmed model of the main job;
// without it the bench first runs the main job's SFT warm-up, config/sft_arithmetic.ini)
#include "bench_json.hpp"

#include <hyflow/tokenizers/tokenizer.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>
#include <hyflow/trainer/sft_trainer.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <unistd.h>

using namespace hyflow::trainer;
namespace fs = std::filesystem;

namespace {
void emit(const std::string& c, double value, const std::string& unit, double peer, bool higher_is_better) {
  hyflow_bench::emit("grpo_step", c, value, unit, "pytorch-1.13 (python)", peer,
                     higher_is_better ? value / peer : peer / value);
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 6;
  const fs::path tmp = fs::temp_directory_path() / ("hyflow_trainer_bench_" + std::to_string(::getpid()));
  std::string model = argc > 1 ? argv[1] : "";
  if (model.empty()) {  // the main job's warm-up, as scripts/main-job.sh runs it
    Config sft(ConfigSchema::sft);
    sft.apply_arguments(
        {std::string("--config=") + HYFLOW_SFT_CONFIG, "--trainer.default_local_dir=" + (tmp / "sft").string()});
    std::cerr << "trainer_bench: no MODEL_DIR given, warming up the built-in model (" << HYFLOW_SFT_CONFIG << ")\n";
    std::streambuf* out = std::cout.rdbuf(std::cerr.rdbuf());  // stdout carries only JSON lines
    (void)run_sft(sft);
    std::cout.rdbuf(out);
    model = (tmp / "sft").string();
  }
  Config c;
  c.apply_arguments({std::string("--config=") + HYFLOW_TRAINER_CONFIG, "--actor_rollout_ref.model.path=" + model,
                     "--trainer.total_training_steps=" + std::to_string(steps), "--trainer.test_freq=-1",
                     "--trainer.val_before_train=false", "--trainer.logger=['jsonl']", "--data.shuffle=false",
                     "--trainer.default_local_dir=" + tmp.string()});
  PPOTrainer trainer(c);
  trainer.init_workers();
  trainer.fit();
  const auto& h = trainer.history();
  std::map<std::string, double> mean;
  double tokens = 0;
  for (size_t i = 1; i < h.size(); ++i) {  // step 1 warms up
    for (const auto& [k, v] : h[i].items())
      if (k.rfind("timing_s/", 0) == 0) mean[k] += v.get<double>() / static_cast<double>(h.size() - 1);
    tokens += h[i].at("perf/total_num_tokens").get<double>() / static_cast<double>(h.size() - 1);
  }

  // The same prompts (first batch, no shuffle) for the peer.
  auto tok = load_tokenizer(model);
  SyntheticTask task{.task = c.get_string("data.synthetic.task"), .size = c.get_int("data.synthetic.train_size"),
                     .max_operand = c.get_int("data.synthetic.max_operand"),
                     .seed = static_cast<uint64_t>(c.get_int("data.synthetic.seed"))};
  RLDataset ds(load_samples("", task), tok, {.max_prompt_length = c.get_int("data.max_prompt_length")});
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < c.get_int("data.train_batch_size"); ++i) idx.push_back(i);
  auto b = ds.batch(idx);
  nlohmann::json prompts;
  const auto& ids = b.batch.at("input_ids");
  const auto& mask = b.batch.at("attention_mask");
  for (int64_t r = 0; r < ids.size(0); ++r) {
    prompts["input_ids"].push_back(
        std::vector<int64_t>(ids[r].data_ptr<int64_t>(), ids[r].data_ptr<int64_t>() + ids.size(1)));
    prompts["attention_mask"].push_back(
        std::vector<int64_t>(mask[r].data_ptr<int64_t>(), mask[r].data_ptr<int64_t>() + ids.size(1)));
    prompts["truths"].push_back(b.non_tensor_batch.at("reward_model")[static_cast<size_t>(r)].at("ground_truth"));
  }
  for (int64_t t = 0; t < tok->vocab_size(); ++t) prompts["itos"].push_back(tok->decode({t}));
  const fs::path prompts_file = tmp / "prompts.json";
  std::ofstream(prompts_file) << prompts.dump();
  // Debian's python3-torch lives in /usr/bin/python3's site-packages; HYFLOW_PYTHON overrides.
  const char* python = std::getenv("HYFLOW_PYTHON");
  const std::string cmd = std::string(python ? python : "/usr/bin/python3") + " " +
                          std::string(HYFLOW_TRAINER_PEER_SCRIPT) + " " + model + " " + prompts_file.string() + " " +
                          std::to_string(c.get_int("actor_rollout_ref.rollout.n")) + " " +
                          std::to_string(c.get_int("data.max_response_length")) + " " + std::to_string(steps) + " " +
                          std::to_string(c.get_double("actor_rollout_ref.actor.optim.lr"));
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (pipe && fgets(buf, sizeof buf, pipe)) out += buf;
  if (!pipe || ::pclose(pipe) != 0) {
    std::cerr << "peer failed: " << cmd << "\n" << out;
    return 1;
  }
  const auto peer = nlohmann::json::parse(out.substr(out.find('{')));
  const double peer_step = peer.at("mean_step_s").get<double>();
  emit("step time (main-job config, s)", mean["timing_s/step"], "s", peer_step, false);
  emit("throughput (tokens/s)", tokens / mean["timing_s/step"], "tokens/s", peer.at("tokens").get<double>() / peer_step,
       true);
  for (const char* part : {"gen", "reward", "old_log_prob", "adv", "update_actor"})
    if (mean.count(std::string("timing_s/") + part) && peer.at("timing").contains(part))
      emit(std::string("timing_s/") + part, mean[std::string("timing_s/") + part], "s",
           peer.at("timing").at(part).get<double>(), false);
  fs::remove_all(tmp);
  return 0;
}
