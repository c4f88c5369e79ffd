#include "common/tiny_model.hpp"

#include <hyflow/agents/agent_loop.hpp>
#include <hyflow/agents/agent_rollout.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <condition_variable>
#include <fstream>
#include <mutex>

using namespace hyflow;
using namespace hyflow::agents;
using Json = nlohmann::json;

namespace {

std::shared_ptr<tokenizers::CharTokenizer> chat_tokenizer() {
  return std::make_shared<tokenizers::CharTokenizer>(tokenizers::chat_char_options());
}

models::CausalLM tiny_model(int64_t vocab) {
  torch::manual_seed(11);
  testing::TinyShape shape;
  shape.vocab_size = vocab;
  shape.max_position_embeddings = 2048;
  models::CausalLM model(testing::tiny_model_config(shape));
  model->eval();
  return model;
}

/// A tool config file in `dir` with the built-in calculator; returns its path.
std::string calculator_tools_file(const testing::TempDir& dir) {
  const auto path = (dir.path / "tools.yaml").string();
  std::ofstream(path) << "tools:\n  - class_name: hyflow.tools.CalculatorTool\n"
                         "    tool_schema: {type: function, function: {name: calculator, description: math}}\n";
  return path;
}

DataProto prompts_of(const tokenizers::Tokenizer& tok, const std::vector<std::string>& questions, int64_t P) {
  const auto B = static_cast<int64_t>(questions.size());
  auto ids = torch::full({B, P}, tok.pad_token_id(), torch::kLong);
  dataproto::Column raw;
  for (int64_t i = 0; i < B; ++i) {
    const auto q = tok.encode(questions[static_cast<size_t>(i)]);  // only the width matters to the loops
    for (size_t j = 0; j < q.size() && static_cast<int64_t>(j) < P; ++j) ids[i][P - 1 - static_cast<int64_t>(j)] = q[j];
    raw.emplace_back(questions[static_cast<size_t>(i)]);
  }
  dataproto::NonTensorBatch nt;
  nt["raw_prompt"] = std::move(raw);
  return DataProto(TensorDict{{"input_ids", ids}, {"attention_mask", ids.ne(tok.pad_token_id()).to(torch::kLong)}},
                   std::move(nt), Json{{"validate", false}});
}

inference::GenerationOptions options_of(int64_t R) {
  inference::GenerationOptions o;
  o.max_new_tokens = R;
  o.do_sample = true;
  o.sampling.temperature = 1.0;
  o.seed = 3;
  o.decode.max_batch = 8;
  return o;
}

// Row 0 waits (up to 10 s) until every other row finished on the engine, then generates.
class WaitingAgentLoop final : public AgentLoop {
 public:
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    int finished = 0;
    int ready = 0;
    bool waited_out = false;
  };
  WaitingAgentLoop(const AgentLoopContext& c, Gate& gate, int others) : AgentLoop(c), gate_(gate), others_(others) {}
  AgentLoopOutput run(const AgentSample& sample) override {
    if (sample.instance_id == "row0") {
      std::unique_lock lock(gate_.mu);
      gate_.waited_out = !gate_.cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate_.finished == others_; });
    } else {  // the others start together, so their requests overlap on the engine
      std::unique_lock lock(gate_.mu);
      ++gate_.ready;
      gate_.cv.notify_all();
      gate_.cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate_.ready == others_; });
    }
    AgentLoopOutput out;
    out.prompt_ids = prompt_ids(sample);
    TokenResult r = context().generator->generate({.prompt = out.prompt_ids,
                                                   .max_tokens = context().response_length,
                                                   .sampling = context().sampling,
                                                   .seed = sample.seed});
    out.response_ids = r.ids;
    out.response_mask.assign(r.ids.size(), 1);
    out.response_log_probs = r.log_probs;
    out.num_turns = 2;
    out.metrics = {{"tool_calls", 0}};
    if (sample.instance_id != "row0") {
      std::lock_guard lock(gate_.mu);
      ++gate_.finished;
      gate_.cv.notify_all();
    }
    return out;
  }

 private:
  Gate& gate_;
  int others_;
};

}  // namespace

TEST_CASE("the agent rollout runs rows through their loops on one engine loop", "[agents]") {
  auto tok = chat_tokenizer();
  auto model = tiny_model(tok->vocab_size());
  const testing::TempDir dir("agent_rollout");
  const auto tools = calculator_tools_file(dir);
  Json rollout = {{"multi_turn", {{"enable", true}, {"tool_config_path", tools}, {"max_assistant_turns", 2}}},
                  {"agent", {{"num_workers", 4}}},
                  {"prompt_length", 1024}};
  Json unset = rollout;
  unset.erase("prompt_length");
  CHECK_THROWS_WITH(AgentRollout(unset, tok).generate(model, prompts_of(*tok, {"q"}, 40), options_of(4)),
                    Catch::Contains("more than the prompt length 40") && Catch::Contains("prompt_length"));
  AgentRollout agents(rollout, tok);
  CHECK(agents.agent().default_agent_loop == "tool_agent");
  const DataProto prompts = prompts_of(*tok, {"What is 12*34?", "What is 5-7?", "1+1?"}, 40);
  const DataProto out = agents.generate(model, prompts, options_of(24));
  const auto& b = out.batch;
  CHECK(b.at("responses").sizes() == c10::IntArrayRef({3, 24}));
  CHECK(b.at("input_ids").sizes() == c10::IntArrayRef({3, 1048}));
  // the model's own ids only: within the attention mask of the response
  const auto resp_attn = b.at("attention_mask").narrow(1, 1024, 24);
  CHECK(b.at("response_mask").le(resp_attn).all().item<bool>());
  CHECK(b.at("response_mask").sum().item<int64_t>() > 0);
  // sampled ids carry the engine's log-probs (negative), others 0
  CHECK(b.at("rollout_log_probs").masked_select(b.at("response_mask").eq(0)).eq(0).all().item<bool>());
  CHECK(b.at("rollout_log_probs").masked_select(b.at("response_mask").eq(1)).lt(0).all().item<bool>());
  CHECK(out.non_tensor_batch.contains("raw_prompt"));
  CHECK(out.meta_info["validate"] == false);
  const Json m = agent_batch_metrics(out);
  CHECK(m["num_turns/min"].get<int64_t>() >= 2);
  // greedy rollouts are reproducible
  auto greedy = options_of(24);
  greedy.do_sample = false;
  const at::Tensor first = agents.generate(model, prompts, greedy).batch.at("responses");
  CHECK(torch::equal(agents.generate(model, prompts, greedy).batch.at("responses"), first));

  DataProto no_raw(prompts.batch, {}, Json::object());
  CHECK_THROWS_WITH(agents.generate(model, no_raw, options_of(8)), Catch::Contains("raw_prompt"));
  CHECK_THROWS_WITH(AgentRollout({{"agent", {{"default_agent_loop", "react_agent"}}}}, tok),
                    Catch::Contains("default_agent_loop") && Catch::Contains("react_agent"));
}

TEST_CASE("apply_chat_template_kwargs gives the loops a compact system turn without the tools", "[agents]") {
  auto tok = chat_tokenizer();
  auto model = tiny_model(tok->vocab_size());
  const testing::TempDir dir("agent_rollout_kwargs");
  const auto tools = calculator_tools_file(dir);
  Json rollout = {{"multi_turn", {{"enable", true}, {"tool_config_path", tools}}},
                  {"apply_chat_template_kwargs", {{"default_system", "Call the calculator."}, {"list_tools", false}}},
                  {"prompt_length", 64}};
  auto greedy = options_of(4);
  greedy.do_sample = false;
  const DataProto prompts = prompts_of(*tok, {"1234*5678="}, 16);
  const at::Tensor row = AgentRollout(rollout, tok).generate(model, prompts, greedy).batch.at("prompts")[0];
  const std::vector<int64_t> expected = tok->encode(
      "<|im_start|>system\nCall the calculator.<|im_end|>\n<|im_start|>user\n1234*5678=<|im_end|>\n"
      "<|im_start|>assistant\n");
  REQUIRE(expected.size() <= 64);
  const auto n = static_cast<int64_t>(expected.size());
  const at::Tensor ids = row.narrow(0, 64 - n, n).contiguous();  // left-padded to prompt_length
  CHECK(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n) == expected);
  CHECK(row.narrow(0, 0, 64 - n).eq(tok->pad_token_id()).all().item<bool>());

  // listed, the calculator's schema alone overflows these 64 ids
  rollout["apply_chat_template_kwargs"]["list_tools"] = true;
  CHECK_THROWS_WITH(AgentRollout(rollout, tok).generate(model, prompts, greedy),
                    Catch::Contains("more than the prompt length 64"));
  rollout["apply_chat_template_kwargs"] = {{"enable_thinking", false}};
  CHECK_THROWS_WITH(AgentRollout(rollout, tok), Catch::Contains("data.apply_chat_template_kwargs.enable_thinking"));
  rollout["apply_chat_template_kwargs"] = {{"list_tools", "no"}};
  CHECK_THROWS_WITH(AgentRollout(rollout, tok), Catch::Contains("data.apply_chat_template_kwargs.list_tools"));
}

TEST_CASE("a sample that waits does not stall the others on the engine", "[agents]") {
  auto tok = chat_tokenizer();
  auto model = tiny_model(tok->vocab_size());
  WaitingAgentLoop::Gate gate;
  register_agent_loop("test_waiting_agent",
                      [&gate](const AgentLoopContext& c) { return std::make_unique<WaitingAgentLoop>(c, gate, 3); });
  AgentRollout agents(
      {{"agent", {{"num_workers", 4}, {"default_agent_loop", "test_waiting_agent"}}}, {"prompt_length", 256}}, tok);
  const DataProto out = agents.generate(model, prompts_of(*tok, {"a", "b", "c", "d"}, 40), options_of(32));
  CHECK_FALSE(gate.waited_out);
  CHECK(gate.finished == 3);
  // sampled requests without seeds of their own share the engine's batch
  const Json stats = agents.last_engine_stats();
  CHECK(stats["admitted"] == 4);
  CHECK(stats["peak_running"].get<int64_t>() >= 2);
  CHECK(out.batch.at("response_mask").sum(1).gt(0).all().item<bool>());
}
