// The trainer end to end with actor_rollout_ref.rollout.multi_turn.enable: a short GRPO run whose
// rollouts go through tool_agent with the calculator (config/tools/calculator.yaml). The tiny model
// first memorizes, in the test, one trajectory (a calculator call, then the answer after the tool's
// response) so that its rollouts call the tool; the step metrics then pin the batch's masks: the
// tool turn's ids are the masked ones, the response's attention covers all three turns.
#include "common/tiny_model.hpp"

#include <hyflow/agents/agent_config.hpp>
#include <hyflow/agents/tool.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/tokenizers/chat_template.hpp>
#include <hyflow/trainer/config.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <iostream>

using namespace hyflow;
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

const std::string kCall =
    "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2*3\"}}\n</tool_call>";


tokenizers::ChatTemplateOptions calculator_chat(bool generation_prompt) {
  tokenizers::ChatTemplateOptions o;
  o.add_generation_prompt = generation_prompt;
  for (const auto& [name, tool] : agents::load_tool_config(AGENT_TOOL_CONFIG))
    o.tools.push_back(nlohmann::ordered_json(tool->schema().to_openai()));
  return o;
}

/// The ids of one trajectory's three response parts: the call (with its end token), the tool turn, the answer.
struct Trajectory {
  std::vector<int64_t> prompt, call, tool_turn, answer;
};

Trajectory trajectory(const tokenizers::Tokenizer& tok, const std::string& question) {
  using tokenizers::ChatMessage;
  const std::vector<ChatMessage> asked = {{"user", question}};
  const std::vector<ChatMessage> all = {{"user", question}, {"assistant", kCall}, {"tool", "6"}, {"assistant", "6"}};
  const std::string prompt = tokenizers::apply_chatml(asked, calculator_chat(true));
  std::string full = tokenizers::apply_chatml(all, calculator_chat(false));
  REQUIRE(full.compare(0, prompt.size(), prompt) == 0);
  REQUIRE(full.back() == '\n');  // the template's newline after the last end token: never sampled
  full.pop_back();
  const std::string response = full.substr(prompt.size());
  const std::string call = kCall + "<|im_end|>", answer = "6<|im_end|>";
  REQUIRE(response.compare(0, call.size(), call) == 0);
  REQUIRE(response.compare(response.size() - answer.size(), answer.size(), answer) == 0);
  return {tok.encode(prompt), tok.encode(call),
          tok.encode(response.substr(call.size(), response.size() - call.size() - answer.size())), tok.encode(answer)};
}

/// A model directory (chat char tokenizer, 2 layers) whose greedy rollouts of "a+b=" call the
/// calculator with 2*3 and answer 6: trained here on that trajectory after five such prompts.
const fs::path& tool_model() {
  static testing::TempDir dir("agent_trainer_model");
  static bool done = [] {
    const tokenizers::CharTokenizer tok(tokenizers::chat_char_options());
    testing::TinyShape shape;
    shape.vocab_size = tok.vocab_size();
    shape.max_position_embeddings = 1280;
    shape.eos_token_id = tok.eos_token_id();
    shape.pad_token_id = tok.pad_token_id();
    auto config = testing::tiny_model_config(shape);
    config.hidden_size = 64;
    torch::manual_seed(5);
    models::CausalLM model(config);
    std::vector<at::Tensor> rows;
    int64_t start = 0;
    for (const char* q : {"1+2=", "5+7=", "9+0=", "3+4=", "6+8="}) {  // every digit: the output must not depend on them
      const Trajectory t = trajectory(tok, q);
      std::vector<int64_t> seq = t.prompt;
      for (const auto* part : {&t.call, &t.tool_turn, &t.answer}) seq.insert(seq.end(), part->begin(), part->end());
      rows.push_back(torch::tensor(seq));
      start = static_cast<int64_t>(t.prompt.size());
    }
    const auto ids = torch::stack(rows);
    const int64_t T = ids.size(1);
    const auto targets = ids.narrow(1, start, T - start).reshape({-1});
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
    // until the trajectory's every id is the argmax by a wide margin (deterministic: a fixed seed, one thread)
    int step = 0;
    for (double loss_value = 1e9; loss_value > 0.002; ++step) {
      REQUIRE(step < 400);
      const auto logits = model->forward(ids).narrow(1, start - 1, T - start);
      const auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets);
      opt.zero_grad();
      loss.backward();
      opt.step();
      loss_value = loss.item<double>();
    }
    std::cout << "tool model: memorized the trajectory (" << T << " ids) in " << step << " steps\n";
    models::save_pretrained(*model, config, dir.path);
    trainer::save_char_tokenizer_config(dir.path.string(), tokenizers::chat_char_options());
    return true;
  }();
  (void)done;
  return dir.path;
}

}  // namespace

TEST_CASE("GRPO with multi_turn.enable: tool_agent rollouts call the calculator, the tool turn is masked out") {
  const fs::path& model = tool_model();
  testing::TempDir out("agent_trainer");
  trainer::Config c;
  c.apply_arguments({"--algorithm.adv_estimator=grpo",
                     "--actor_rollout_ref.model.path=" + model.string(),
                     "--data.max_prompt_length=8",
                     "--data.max_response_length=160",
                     "--data.train_batch_size=2",
                     "--data.synthetic.train_size=16",
                     "--data.synthetic.val_size=2",
                     "--data.synthetic.max_operand=9",
                     "--actor_rollout_ref.actor.ppo_mini_batch_size=2",
                     "--actor_rollout_ref.actor.optim.lr=1e-6",
                     "--actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                     "--actor_rollout_ref.rollout.n=2",
                     "--actor_rollout_ref.rollout.temperature=0.05",
                     "--actor_rollout_ref.rollout.prompt_length=1024",
                     "--actor_rollout_ref.rollout.multi_turn.enable=true",
                     "--actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
                     std::string("--actor_rollout_ref.rollout.multi_turn.tool_config_path=") + AGENT_TOOL_CONFIG,
                     "--trainer.n_gpus_per_node=2",
                     "--trainer.total_training_steps=2",
                     "--trainer.test_freq=2",
                     "--trainer.logger=['jsonl']",
                     "--trainer.default_local_dir=" + out.path.string()});
  trainer::PPOTrainer t(c);
  t.init_workers();
  t.fit();
  const tokenizers::CharTokenizer tok(tokenizers::chat_char_options());
  const Trajectory traj = trajectory(tok, "1+2=");
  const auto call = static_cast<double>(traj.call.size()), tool = static_cast<double>(traj.tool_turn.size()),
             answer = static_cast<double>(traj.answer.size());
  int64_t trained = 0;
  for (const auto& m : t.history()) {
    INFO(m.dump());
    if (m.at("step").get<int64_t>() == 0 || !m.contains("actor/pg_loss")) continue;
    ++trained;
    // user, assistant (the call), tool, assistant (the answer)
    CHECK(m.at("num_turns/mean").get<double>() == Approx(4.0));
    CHECK(m.at("agent/tool_calls/mean").get<double>() == Approx(1.0));
    CHECK(m.at("agent/tool_success_rate").get<double>() == Approx(1.0));
    CHECK(m.at("agent/cut_by_length").get<double>() == Approx(0.0));
    // the attention covers the three parts, the response mask only the model's two
    CHECK(m.at("response_length/mean").get<double>() == Approx(call + tool + answer));
    CHECK(m.at("agent/masked_token_fraction").get<double>() == Approx(tool / (call + tool + answer)));
    CHECK(m.contains("agent/tool_latency_s/mean"));
    CHECK(std::isfinite(m.at("actor/pg_loss").get<double>()));
  }
  CHECK(trained == 2);
  // validation decodes greedily through the same loops: the answer after the tool is 6, right for sums of 6 only
  CHECK(t.history().back().contains("val-core/arithmetic/reward/mean@1"));
}
