// SFT trainer and hyflow-sft's main (see sft_trainer.hpp).
#include <hyflow/algos/lr_schedule.hpp>
#include <hyflow/algos/reward_score.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/inference/generation.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/tracking/prometheus_tracker.hpp>
#include <hyflow/tracking/tracking.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/run_folder.hpp>
#include <hyflow/trainer/sft_trainer.hpp>
#include <hyflow/workers/config.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>

namespace hyflow::trainer {

namespace {

/// trainer.prometheus.*, checked when trainer.logger names the prometheus tracker.
tracking::PrometheusEndpoint prometheus_endpoint(const Config& c) {
  tracking::PrometheusEndpoint p;
  if (!c.is_null("trainer.prometheus.port")) p.port = c.get_int("trainer.prometheus.port");
  p.bind = c.get_string("trainer.prometheus.bind");
  if (!c.is_null("trainer.prometheus.token_file")) p.token_file = c.get_string("trainer.prometheus.token_file");
  const auto logger = tracking::logger_backends(c.get("trainer.logger"));
  if (std::find(logger.begin(), logger.end(), "prometheus") != logger.end()) tracking::check_prometheus_endpoint(p);
  return p;
}

models::ModelConfig tiny_model_config(const Config& c, const tokenizers::Tokenizer& tok, int64_t max_length) {
  models::ModelConfig m;
  m.architecture = "Qwen2ForCausalLM";
  m.vocab_size = tok.vocab_size();
  m.hidden_size = c.get_int("model.tiny.hidden_size");
  m.intermediate_size = c.get_int("model.tiny.intermediate_size");
  m.num_hidden_layers = c.get_int("model.tiny.num_hidden_layers");
  m.num_attention_heads = c.get_int("model.tiny.num_attention_heads");
  m.num_key_value_heads = m.num_attention_heads;
  m.rope_theta = c.get_double("model.tiny.rope_theta");
  m.max_position_embeddings = std::max<int64_t>(256, 2 * max_length);
  m.qkv_bias = true;
  m.tie_word_embeddings = true;
  m.eos_token_ids = {tok.eos_token_id()};
  m.pad_token_id = tok.pad_token_id();
  m.initializer_range = 0.02;
  m.validate();
  return m;
}

/// Masked token cross-entropy: logits at t score token t+1 where loss_mask[t+1] is set.
at::Tensor sft_loss(models::CausalLM& model, const DataProto& mb) {
  const auto& ids = mb.batch.at("input_ids");
  auto logits = model->forward(ids, mb.batch.at("attention_mask"), mb.batch.at("position_ids"));
  const int64_t L = ids.size(1);
  auto shift_logits = logits.narrow(1, 0, L - 1).reshape({-1, logits.size(-1)});
  auto labels = ids.narrow(1, 1, L - 1).reshape({-1});
  auto mask = mb.batch.at("loss_mask").narrow(1, 1, L - 1).reshape({-1}).to(at::kFloat);
  auto ce = torch::nn::functional::cross_entropy(
      shift_logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  return (ce * mask).sum() / (mask.sum() + 1e-8);
}

double eval_loss(models::CausalLM& model, const SFTDataset& ds, int64_t micro) {
  torch::NoGradGuard ng;
  double total = 0;
  int64_t batches = 0;
  for (int64_t s = 0; s < ds.size(); s += micro) {
    std::vector<int64_t> idx;
    for (int64_t i = s; i < std::min(s + micro, ds.size()); ++i) idx.push_back(i);
    total += sft_loss(model, ds.batch(idx)).item<double>();
    ++batches;
  }
  return batches ? total / static_cast<double>(batches) : 0.0;
}

/// Greedy answers scored with the task's reward function (the RL validation metric).
double greedy_accuracy(models::CausalLM& model, const tokenizers::Tokenizer& tok, const std::vector<Sample>& rows,
                       int64_t max_new_tokens) {
  if (rows.empty()) return 0.0;
  std::vector<std::string> prompts;
  for (const auto& r : rows) prompts.push_back(r.prompt);
  DataProto in = tokenizers::encode_prompts(tok, prompts);
  inference::GenerationOptions g;
  g.max_new_tokens = max_new_tokens;
  g.do_sample = false;
  DataProto out = inference::generate(model, in, g);
  const auto& resp = out.batch.at("responses");
  const auto& rmask = out.batch.at("response_mask");
  double correct = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t len = rmask[static_cast<int64_t>(i)].sum().item<int64_t>();
    auto row = resp[static_cast<int64_t>(i)].narrow(0, 0, len).contiguous();
    std::vector<int64_t> ids(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + len);
    const auto text = tok.decode(ids, /*skip_special_tokens=*/true);
    correct += algos::reward_score::default_compute_score(rows[i].data_source, text, rows[i].ground_truth).score > 0
                   ? 1.0
                   : 0.0;
  }
  return correct / static_cast<double>(rows.size());
}

}  // namespace

parallel::OptimConfig sft_optim_defaults() {
  parallel::OptimConfig o;  // verl's sft_trainer defaults
  o.lr = 1e-5;
  o.betas = {0.9, 0.95};
  o.weight_decay = 0.01;
  o.lr_warmup_steps_ratio = 0.1;
  o.lr_scheduler_type = "cosine";
  return o;
}

SFTResult run_sft(const Config& c) {
  if (c.schema() != ConfigSchema::sft) throw ValueError("run_sft needs an SFT config");
  const tracking::PrometheusEndpoint prometheus = prometheus_endpoint(c);  // checked before anything loads
  const int64_t max_length = c.get_int("data.max_length");
  const int64_t bs = c.get_int("data.train_batch_size");
  const int64_t micro = c.get_int("data.micro_batch_size_per_gpu");
  if (bs <= 0 || micro <= 0 || bs % micro != 0)
    throw ValueError("config keys 'data.train_batch_size' (" + std::to_string(bs) +
                     ") and 'data.micro_batch_size_per_gpu' (" + std::to_string(micro) +
                     ") must be > 0 and the first a multiple of the second");
  const std::string pretrain = c.get_string("model.partial_pretrain");
  const bool chat_task = c.get_string("data.train_files").empty() && is_chat_task(c.get_string("data.synthetic.task"));
  if (chat_task && c.get_bool("data.apply_chat_template_kwargs.list_tools"))
    throw ValueError("config key 'data.apply_chat_template_kwargs.list_tools' must be false with data.synthetic.task " +
                     c.get_string("data.synthetic.task") +
                     " (its rows list no tools; the warm-up teaches the call): set it false here and in the GRPO "
                     "config, so that both render the same prompt");
  // A new tiny model of a chat task gets the chat char tokenizer (the template's specials, the call's JSON).
  const tokenizers::CharTokenizerOptions char_options =
      chat_task ? tokenizers::chat_char_options() : tokenizers::CharTokenizerOptions{};
  std::shared_ptr<const tokenizers::Tokenizer> tok =
      pretrain.empty() ? std::make_shared<tokenizers::CharTokenizer>(char_options) : load_tokenizer(pretrain);
  models::ModelConfig mcfg;
  models::CausalLM model{nullptr};
  if (pretrain.empty()) {
    mcfg = tiny_model_config(c, *tok, max_length);
    torch::manual_seed(static_cast<uint64_t>(c.get_int("model.tiny.seed")));
    model = models::CausalLM(mcfg);
  } else {
    model = models::load_causal_lm(pretrain);
    mcfg = model->config();
  }

  SyntheticTask task{.task = c.get_string("data.synthetic.task"),
                     .size = c.get_int("data.synthetic.train_size"),
                     .max_operand = c.get_int("data.synthetic.max_operand"),
                     .seed = static_cast<uint64_t>(c.get_int("data.synthetic.seed")),
                     .correct_fraction = c.get_double("data.synthetic.correct_fraction"),
                     .tool_fraction = c.get_double("data.synthetic.tool_fraction")};
  if (!c.is_null("data.apply_chat_template_kwargs.default_system"))
    task.chat.default_system = c.get_string("data.apply_chat_template_kwargs.default_system");
  const std::string pk = c.get_string("data.prompt_key"), rk = c.get_string("data.response_key");
  auto train_rows = load_samples(c.get_string("data.train_files"), task, pk, rk);
  SyntheticTask vtask = task;
  vtask.size = c.get_int("data.synthetic.val_size");
  vtask.seed = task.seed + 7919;
  vtask.held_out = true;
  vtask.correct_fraction = 1.0;
  auto val_rows = load_samples(c.get_string("data.val_files"), vtask, pk, rk);
  SFTDataset train(train_rows, tok, max_length, c.get_string("data.truncation"));
  SFTDataset val(val_rows, tok, max_length, c.get_string("data.truncation"));
  const int64_t steps_per_epoch = train.size() / bs;
  if (steps_per_epoch == 0) throw ValueError("config key 'data.train_batch_size' exceeds the training set");
  const int64_t total = c.is_null("trainer.total_training_steps") ? steps_per_epoch * c.get_int("trainer.total_epochs")
                                                                  : c.get_int("trainer.total_training_steps");

  // The actor's optimizer section (the same keys and checks), with SFT's defaults.
  nlohmann::json optim_json = c.subtree("optim");
  optim_json["total_training_steps"] = total;
  const parallel::OptimConfig o = workers::parse_optim_config(optim_json, "optim", sft_optim_defaults());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(o.lr)
                                                   .betas({o.betas[0], o.betas[1]})
                                                   .eps(o.eps)
                                                   .weight_decay(o.weight_decay));
  algos::core_algos::LambdaLR scheduler(
      opt,
      algos::core_algos::get_lr_schedule({.type = o.lr_scheduler_type,
                                          .num_warmup_steps = o.resolved_warmup_steps("optim.lr_warmup_steps_ratio"),
                                          .num_training_steps = total,
                                          .min_lr_ratio = o.min_lr_ratio,
                                          .num_cycles = o.num_cycles},
                                         "optim.lr_scheduler_type"));
  const double clip = c.get_double("optim.clip_grad");
  const int64_t test_freq = c.get_int("trainer.test_freq");
  const std::string out_dir = c.get_string("trainer.default_local_dir");
  const std::string metrics_file =
      c.is_null("trainer.metrics_file") ? out_dir + "/sft_metrics.jsonl" : c.get_string("trainer.metrics_file");
  write_run_folder(out_dir, c, /*resumed_step=*/0);  // SFT does not resume: each launch is a fresh run
  tracking::Tracking tracking(
      tracking::logger_backends(c.get("trainer.logger")),
      tracking::RunInfo{.project_name = c.get_string("trainer.project_name"),
                        .experiment_name = c.get_string("trainer.experiment_name"),
                        .local_dir = out_dir,
                        .metrics_file = metrics_file,
                        .total_steps = total,
                        .console_every = c.is_null("trainer.console_every") ? 0 : c.get_int("trainer.console_every"),
                        .prometheus = prometheus});
  tracking.log_config(c.tree());

  SFTResult result;
  int64_t step = 0;
  for (int64_t epoch = 0; step < total; ++epoch) {
    const auto order = epoch_order(train.size(), true, static_cast<uint64_t>(c.get_int("trainer.seed")), epoch);
    for (int64_t b = 0; b < steps_per_epoch && step < total; ++b) {
      ++step;
      model->train();
      opt.zero_grad();
      double loss_sum = 0;
      const int64_t n_micro = bs / micro;
      for (int64_t mbi = 0; mbi < n_micro; ++mbi) {
        std::vector<int64_t> idx(order.begin() + b * bs + mbi * micro, order.begin() + b * bs + (mbi + 1) * micro);
        auto loss = sft_loss(model, train.batch(idx)) / static_cast<double>(n_micro);
        loss.backward();
        loss_sum += loss.item<double>();
      }
      const double grad_norm = torch::nn::utils::clip_grad_norm_(model->parameters(), clip);
      if (std::isfinite(grad_norm)) opt.step();
      else opt.zero_grad();
      scheduler.step();
      nlohmann::json m = {{"step", step}, {"train/loss", loss_sum}, {"train/lr", scheduler.get_last_lr().front()},
                          {"train/grad_norm", grad_norm}};
      if ((test_freq > 0 && step % test_freq == 0) || step == total) {
        model->eval();
        m["val/loss"] = eval_loss(model, val, micro);
        result.final_val_loss = m["val/loss"].get<double>();
      }
      tracking.log(m, step);
      result.history.push_back(std::move(m));
    }
  }
  tracking.close();
  model->eval();
  // Rows whose response is a tool call (multiplication_calculator's first turn) have no answer to score.
  std::vector<Sample> answer_rows;
  for (const auto& r : val_rows)
    if (r.extra_info.value("turn", "") != "call") answer_rows.push_back(r);
  result.val_exact_match = greedy_accuracy(model, *tok, answer_rows, max_length / 2);
  std::cout << "sft: greedy accuracy on " << answer_rows.size() << " validation prompts: " << result.val_exact_match
            << std::endl;
  models::save_pretrained(*model, mcfg, out_dir);
  if (pretrain.empty()) save_char_tokenizer_config(out_dir, char_options);
  else if (std::filesystem::exists(std::filesystem::path(pretrain) / "tokenizer_config.json"))
    std::filesystem::copy_file(std::filesystem::path(pretrain) / "tokenizer_config.json",
                               std::filesystem::path(out_dir) / "tokenizer_config.json",
                               std::filesystem::copy_options::overwrite_existing);
  return result;
}

int run_sft_app(int argc, char** argv) {
  Config config(ConfigSchema::sft);
  try {
    if (config.apply_arguments(std::vector<std::string>(argv + 1, argv + argc))) {
      std::cout << "usage: hyflow-sft [--config=file.ini] [--key=value ...]\n\nkeys (with defaults):\n"
                << config.help_text();
      return 0;
    }
  } catch (const Error& e) {
    std::cerr << "hyflow-sft: " << e.what() << "\n";
    return 2;
  }
  try {
    run_sft(config);
  } catch (const std::exception& e) {
    std::cerr << "hyflow-sft: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace hyflow::trainer
