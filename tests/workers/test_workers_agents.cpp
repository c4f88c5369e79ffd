// rollout.multi_turn.enable: ActorRolloutRefWorker::generate_sequences runs each row through its
// agent loop (the row's agent_name) on an engine loop over the policy and returns verl's rollout
// batch; the worker's rollout_log_probs respect the response mask and agree with compute_log_prob.
#include "workers_test_util.hpp"

#include <hyflow/actors/all.hpp>
#include <hyflow/agents/agent_loop.hpp>
#include <hyflow/workers/all.hpp>

#include <catch2/catch.hpp>

using namespace hyflow;
using hyflow::workers::ActorRolloutRefWorker;
using namespace workers_test;

namespace {

constexpr int64_t kChatVocab = 3 + 96;  // <pad> <|im_start|> <|im_end|>, printable ASCII and newline

const std::filesystem::path& chat_model_dir() {
  static TempDir dir("workers_chat_model");
  static bool written = [] {
    hyflow::testing::write_tiny_model(
        hyflow::testing::tiny_model_config({.vocab_size = kChatVocab, .max_position_embeddings = 1024}), 99, dir.path);
    std::string alphabet;
    for (char c = ' '; c <= '~'; ++c) alphabet.push_back(c);
    alphabet += "\n";
    std::ofstream(dir.path / "tokenizer_config.json") << Json{
        {"tokenizer_class", "hyflow-char"},
        {"alphabet", alphabet},
        {"special_tokens", {"<pad>", "<|im_start|>", "<|im_end|>"}},
        {"eos_token", "<|im_end|>"},
        {"pad_token", "<pad>"}}.dump();
    return true;
  }();
  (void)written;
  return dir.path;
}

// One model turn, a tool turn the model did not write ("42", mask 0), another model turn.
class TwoTurnAgent final : public agents::AgentLoop {
 public:
  using AgentLoop::AgentLoop;
  agents::AgentLoopOutput run(const agents::AgentSample& s) override {
    const auto& c = context();
    agents::AgentLoopOutput out;
    out.prompt_ids = prompt_ids(s);
    std::vector<int64_t> conversation = out.prompt_ids;
    auto turn = [&](int64_t max_tokens, std::optional<uint64_t> seed) {
      auto r = c.generator->generate(
          {.prompt = conversation, .max_tokens = max_tokens, .sampling = c.sampling, .seed = seed});
      out.response_ids.insert(out.response_ids.end(), r.ids.begin(), r.ids.end());
      out.response_mask.insert(out.response_mask.end(), r.ids.size(), 1);
      out.response_log_probs.insert(out.response_log_probs.end(), r.log_probs.begin(), r.log_probs.end());
      conversation.insert(conversation.end(), r.ids.begin(), r.ids.end());
    };
    turn(4, s.seed);
    const auto tool = agents::template_turn_ids(c, {{"tool", "42"}});
    out.response_ids.insert(out.response_ids.end(), tool.begin(), tool.end());
    out.response_mask.insert(out.response_mask.end(), tool.size(), 0);
    out.response_log_probs.insert(out.response_log_probs.end(), tool.size(), 0.0F);
    conversation.insert(conversation.end(), tool.begin(), tool.end());
    turn(4, s.seed ? std::optional(*s.seed + 1) : std::nullopt);
    out.num_turns = 4;
    out.metrics = {{"tool_calls", 1}, {"tool_calls_ok", 1}};
    return out;
  }
};

const bool registered =
    (agents::register_agent_loop("test_two_turn_agent",
                                 [](const agents::AgentLoopContext& c) { return std::make_unique<TwoTurnAgent>(c); }),
     true);

Json agent_config() {
  Json config = actor_rollout_ref_config();
  config["model"]["path"] = chat_model_dir().string();
  config["rollout"]["response_length"] = 80;
  config["rollout"]["prompt_length"] = 160;
  config["rollout"]["multi_turn"] = {{"enable", true}, {"max_assistant_turns", 2}};
  config["rollout"]["agent"] = {{"num_workers", 3}};
  return config;
}

DataProto chat_prompts(int64_t rows) {
  DataProto p = prompts(rows);
  dataproto::Column raw, names;
  for (int64_t r = 0; r < rows; ++r) {
    raw.emplace_back("What is " + std::to_string(r) + "+1?");
    names.emplace_back(r % 2 == 0 ? "test_two_turn_agent" : "single_turn_agent");
  }
  p.non_tensor_batch["raw_prompt"] = std::move(raw);
  p.non_tensor_batch["agent_name"] = std::move(names);
  return p;
}

}  // namespace

TEST_CASE("multi_turn.enable: generate_sequences runs agent loops and masks the ids the model did not write") {
  REQUIRE(registered);
  workers::register_workers();
  Runtime rt;
  WorkerGroup wg(rt, ResourcePool({2}),
                 WorkerSpec{"ActorRolloutRefWorker", {{"config", agent_config()}, {"role", "actor_rollout"}}});
  wg.call(&ActorRolloutRefWorker::init_model);
  DataProto out = wg.call(&ActorRolloutRefWorker::generate_sequences, chat_prompts(4));
  REQUIRE(out.size() == 4);
  const auto& b = out.batch;
  CHECK(b.at("prompts").size(1) == 160);
  CHECK(b.at("responses").size(1) == 80);
  const at::Tensor mask = b.at("response_mask");
  const at::Tensor attn = b.at("attention_mask").narrow(1, 160, 80);
  const int64_t tool_len =
      1 + 1 + 5 + 16 + 3 + 16 + 1 + 1 + 1 + 10;  // \n<s>user\n<tool_response>\n42\n</..><e>\n<s>assistant\n
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t masked = (attn[r] - mask[r]).sum().item<int64_t>();
    CHECK(masked == (r % 2 == 0 ? tool_len : 0));  // the two-turn rows, by agent_name
  }
  CHECK(out.non_tensor_batch.find("raw_prompt")->second.size() == 4);
  CHECK(out.non_tensor_batch.find("__num_turns__")->second == dataproto::Column{4, 2, 4, 2});

  // the worker's own rollout_log_probs: 0 off the model's tokens, and those of compute_log_prob on them
  const at::Tensor lp = b.at("rollout_log_probs");
  CHECK(lp.masked_select(mask.eq(0)).eq(0).all().item<bool>());
  CHECK(lp.masked_select(mask.eq(1)).lt(0).all().item<bool>());
  DataProto scored = wg.call(&ActorRolloutRefWorker::compute_log_prob, out);
  const at::Tensor old = scored.batch.at("old_log_probs");
  CHECK(torch::equal(old.masked_select(mask.eq(1)), lp.masked_select(mask.eq(1))));
}

TEST_CASE("multi_turn config errors surface when the worker is built, naming the key") {
  workers::register_workers();
  Runtime rt;
  Json config = agent_config();
  config["rollout"]["multi_turn"]["max_turns"] = 3;
  CHECK_THROWS_WITH(WorkerGroup(rt, ResourcePool({1}),
                                WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", "actor_rollout"}}}),
                    Catch::Contains("actor_rollout_ref.rollout.multi_turn.max_turns"));
  config = agent_config();
  config["rollout"]["multi_turn"]["tool_response_truncate_side"] = "up";  // a value only the agents module checks
  WorkerGroup wg(rt, ResourcePool({1}),
                 WorkerSpec{"ActorRolloutRefWorker", {{"config", config}, {"role", "actor_rollout"}}});
  CHECK_THROWS_WITH(wg.call(&ActorRolloutRefWorker::init_model),
                    Catch::Contains("actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side"));
}
