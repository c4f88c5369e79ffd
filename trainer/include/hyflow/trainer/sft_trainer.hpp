#pragma once
// Supervised fine-tuning (verl's fsdp_sft_trainer, single process): right-padded
// prompt+response rows, token cross-entropy over the response (and eos) tokens, AdamW with
// warmup + cosine, gradient clipping with the non-finite skip. Without model.partial_pretrain
// it creates the built-in tiny char-level model (Qwen2 layout) and saves the result in
// Hugging Face format with the char tokenizer config, ready for the RL trainers.

#include <hyflow/parallel/optim_config.hpp>
#include <hyflow/trainer/config.hpp>

#include <nlohmann/json.hpp>

#include <vector>

namespace hyflow::trainer {

struct SFTResult {
  std::vector<nlohmann::json> history;  ///< train/loss, train/lr, val/loss per logged step
  double final_val_loss = 0.0;
  double val_exact_match = 0.0;  ///< greedy answers equal to the reference response
};

/// Trains and writes the model to trainer.default_local_dir, logging the config and every step
/// through the trackers of trainer.logger (hyflow/tracking/tracking.hpp).
SFTResult run_sft(const Config& config);

/// SFT's optim section defaults (verl's sft_trainer: lr 1e-5, betas (0.9, 0.95), weight decay 0.01,
/// warmup ratio 0.1, cosine); the keys are the actor's (workers::parse_optim_config).
parallel::OptimConfig sft_optim_defaults();

/// main() of hyflow-sft.
int run_sft_app(int argc, char** argv);

}  // namespace hyflow::trainer
