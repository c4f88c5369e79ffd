#include <hyflow/agents/agent_batch.hpp>
#include <hyflow/agents/agent_loop.hpp>
#include <hyflow/agents/agent_rollout.hpp>
#include <hyflow/agents/calculator_tool.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using namespace hyflow;
using namespace hyflow::agents;
using Json = nlohmann::json;
using tokenizers::ChatMessage;

namespace {

std::shared_ptr<tokenizers::CharTokenizer> chat_tokenizer() {
  return std::make_shared<tokenizers::CharTokenizer>(tokenizers::chat_char_options());
}

// A model stand-in: `reply` maps the conversation's text to the assistant's text; it samples
// that text and the end token (cut at max_tokens), log-prob of the k-th id -(k+1)/100.
class ScriptedGenerator final : public TokenGenerator {
 public:
  using Reply = std::function<std::string(const std::string& conversation)>;
  ScriptedGenerator(std::shared_ptr<tokenizers::CharTokenizer> tok, Reply reply)
      : tok_(std::move(tok)), reply_(std::move(reply)) {}

  TokenResult generate(const TokenRequest& request) override {
    const std::string conversation = tok_->decode(request.prompt);
    std::vector<int64_t> ids = tok_->encode(reply_(conversation));
    ids.push_back(tok_->eos_token_id());
    TokenResult r;
    r.stopped = static_cast<int64_t>(ids.size()) <= request.max_tokens;
    if (!r.stopped) ids.resize(static_cast<size_t>(request.max_tokens));
    for (size_t k = 0; k < ids.size(); ++k) r.log_probs.push_back(-static_cast<float>(k + 1) / 100.0F);
    r.ids = std::move(ids);
    std::lock_guard lock(mu_);
    ++calls_;
    sampled_.push_back(r.ids);
    return r;
  }
  std::vector<std::vector<int64_t>> sampled() const {
    std::lock_guard lock(mu_);
    return sampled_;
  }

 private:
  std::shared_ptr<tokenizers::CharTokenizer> tok_;
  Reply reply_;
  mutable std::mutex mu_;
  int64_t calls_ = 0;
  std::vector<std::vector<int64_t>> sampled_;
};

const std::string kCall =
    "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1234*5678\"}}\n</tool_call>";

std::shared_ptr<Tool> calculator() {
  register_calculator_tool();
  return make_tool(kCalculatorToolClass, Json::object(), calculator_schema());
}

AgentLoopContext context_with(TokenGenerator& gen, std::shared_ptr<tokenizers::CharTokenizer> tok) {
  AgentLoopContext c;
  c.generator = &gen;
  c.tokenizer = std::move(tok);
  c.chat.default_system = "Use the tools.";
  c.tools["calculator"] = calculator();
  c.response_length = 1024;
  c.multi_turn.enable = true;
  return c;
}

AgentSample sample_of(const std::string& question, const std::string& id = "s0") {
  AgentSample s;
  s.messages = Json::array({{{"role", "user"}, {"content", question}}});
  s.instance_id = id;
  return s;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A tool returning `text` for any call.
class FixedTool final : public Tool {
 public:
  FixedTool(std::string name, std::string text, ToolStatus status = ToolStatus::ok)
      : Tool(ToolSchema{.name = std::move(name)}), text_(std::move(text)), status_(status) {}
  ToolResult execute(const std::string&, const Json&) override { return {.text = text_, .status = status_}; }

 private:
  std::string text_;
  ToolStatus status_;
};

}  // namespace

TEST_CASE("ids trained on are the sampled ids and the template's tool-turn ids, exactly", "[agents]") {
  auto tok = chat_tokenizer();
  ScriptedGenerator gen(tok, [](const std::string& conv) {
    return has(conv, "<tool_response>") ? std::string("The answer is 7006652.") : kCall;
  });
  AgentLoopContext c = context_with(gen, tok);
  const AgentSample s = sample_of("What is 1234*5678?");
  const AgentLoopOutput out = make_agent_loop("tool_agent", c)->run(s);

  tokenizers::ChatTemplateOptions o{.default_system = "Use the tools.",
                                    .tools = {nlohmann::ordered_json(calculator_schema().to_openai())}};
  CHECK(out.prompt_ids == tok->encode(tokenizers::apply_chatml({{"user", "What is 1234*5678?"}}, o)));

  const auto sampled = gen.sampled();
  REQUIRE(sampled.size() == 2);
  // Qwen2.5's tool turn, written out: what follows the assistant's <|im_end|>
  const std::vector<int64_t> tool_turn =
      tok->encode("\n<|im_start|>user\n<tool_response>\n7006652\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
  std::vector<int64_t> expected = sampled[0];
  expected.insert(expected.end(), tool_turn.begin(), tool_turn.end());
  expected.insert(expected.end(), sampled[1].begin(), sampled[1].end());
  CHECK(out.response_ids == expected);

  std::vector<int64_t> mask(sampled[0].size(), 1);
  mask.insert(mask.end(), tool_turn.size(), 0);
  mask.insert(mask.end(), sampled[1].size(), 1);
  CHECK(out.response_mask == mask);
  REQUIRE(out.response_log_probs.size() == expected.size());
  CHECK(out.response_log_probs[0] == Approx(-0.01F));
  CHECK(out.response_log_probs[sampled[0].size()] == 0.0F);
  CHECK(out.response_log_probs[sampled[0].size() + tool_turn.size()] == Approx(-0.01F));

  // The whole sequence is the template's rendering of the conversation (up to the last end token).
  std::vector<ChatMessage> conversation = {
      {"user", "What is 1234*5678?"},
      {"assistant", "", {{"calculator", nlohmann::ordered_json{{"expression", "1234*5678"}}}}},
      {"tool", "7006652"},
      {"assistant", "The answer is 7006652."}};
  o.add_generation_prompt = false;
  std::vector<int64_t> all = out.prompt_ids;
  all.insert(all.end(), out.response_ids.begin(), out.response_ids.end());
  CHECK(tok->decode(all) + "\n" == tokenizers::apply_chatml(conversation, o));

  CHECK(out.num_turns == 4);
  CHECK(out.metrics["assistant_turns"] == 2);
  CHECK(out.metrics["tool_calls"] == 1);
  CHECK(out.metrics["tool_calls_ok"] == 1);
  CHECK(out.metrics["cut_by_turns"] == false);
  CHECK(out.metrics["cut_by_length"] == false);
}

TEST_CASE("single_turn_agent samples once; unknown loops are named", "[agents]") {
  auto tok = chat_tokenizer();
  ScriptedGenerator gen(tok, [](const std::string&) { return kCall; });
  AgentLoopContext c = context_with(gen, tok);
  const AgentLoopOutput out = make_agent_loop("single_turn_agent", c)->run(sample_of("q"));
  CHECK(gen.sampled().size() == 1);
  CHECK(out.response_ids == gen.sampled()[0]);
  CHECK(out.response_mask == std::vector<int64_t>(out.response_ids.size(), 1));
  CHECK(out.num_turns == 2);
  const auto names = agent_loop_names();
  CHECK(std::find(names.begin(), names.end(), "tool_agent") != names.end());
  CHECK_THROWS_AS(make_agent_loop("tool_agnet", c), KeyError);
  AgentSample typo = sample_of("q");
  typo.agent_name = "nope_agent";
  CHECK_THROWS_WITH(run_agent_loops({typo}, c, "tool_agent", 2), Catch::Contains("nope_agent"));
  CHECK_THROWS_WITH(make_agent_loop("tool_agent", c)->run(AgentSample{.messages = Json::array({1})}),
                    Catch::Contains("messages[0]"));
}

TEST_CASE("turn limits, parallel calls and tool-response truncation", "[agents]") {
  auto tok = chat_tokenizer();
  SECTION("max_assistant_turns stops a model that keeps calling") {
    ScriptedGenerator gen(tok, [](const std::string&) { return kCall; });
    AgentLoopContext c = context_with(gen, tok);
    c.multi_turn.max_assistant_turns = 3;
    const auto out = make_agent_loop("tool_agent", c)->run(sample_of("q"));
    CHECK(gen.sampled().size() == 3);
    CHECK(out.metrics["tool_calls"] == 2);
    CHECK(out.metrics["cut_by_turns"] == true);
    CHECK(agent_loop_metrics({out})["agent/cut_by_turns"] == 1.0);
  }
  SECTION("max_user_turns counts tool turns") {
    ScriptedGenerator gen(tok, [](const std::string&) { return kCall; });
    AgentLoopContext c = context_with(gen, tok);
    c.multi_turn.max_user_turns = 1;
    const auto out = make_agent_loop("tool_agent", c)->run(sample_of("q"));
    CHECK(gen.sampled().size() == 2);
    CHECK(out.metrics["user_turns"] == 1);
    CHECK(out.metrics["cut_by_turns"] == true);
  }
  SECTION("at most max_parallel_calls calls run per turn; errors go back as text") {
    ScriptedGenerator gen(tok, [](const std::string& conv) {
      if (has(conv, "<tool_response>")) return std::string("done");
      return kCall + "\n" + kCall + "\n<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>";
    });
    AgentLoopContext c = context_with(gen, tok);
    c.multi_turn.max_parallel_calls = 2;
    auto out = make_agent_loop("tool_agent", c)->run(sample_of("q"));
    CHECK(out.metrics["tool_calls"] == 2);
    CHECK(tok->decode(out.response_ids).find("<tool_response>\n7006652\n</tool_response>\n<tool_response>\n7006652") !=
          std::string::npos);
    c.multi_turn.max_parallel_calls = 3;
    out = make_agent_loop("tool_agent", c)->run(sample_of("q"));
    CHECK(out.metrics["tool_calls"] == 3);
    CHECK(out.metrics["tool_calls_error"] == 1);
    CHECK(has(tok->decode(out.response_ids), "Error: no tool named 'nope'"));
    const Json m = agent_loop_metrics({out});
    CHECK(m["agent/tool_error_rate"].get<double>() == Approx(1.0 / 3));
    CHECK(m["agent/tool_success_rate"].get<double>() == Approx(2.0 / 3));
  }
  SECTION("long tool responses are cut to max_tool_response_length") {
    ScriptedGenerator gen(tok, [](const std::string& conv) {
      return has(conv, "<tool_response>")
                 ? std::string("ok")
                 : std::string("<tool_call>\n{\"name\": \"big\", \"arguments\": {}}\n</tool_call>");
    });
    AgentLoopContext c = context_with(gen, tok);
    c.tools["big"] =
        std::make_shared<FixedTool>("big", std::string(100, 'a') + std::string(100, 'b'), ToolStatus::timeout);
    c.multi_turn.max_tool_response_length = 10;
    c.multi_turn.tool_response_truncate_side = TruncateSide::right;
    const auto out = make_agent_loop("tool_agent", c)->run(sample_of("q"));
    CHECK(has(tok->decode(out.response_ids), "<tool_response>\n(truncated)...bbbbbbbbbb\n</tool_response>"));
    CHECK(out.metrics["tool_calls_timeout"] == 1);
  }
  SECTION("the response length bounds all turns together") {
    ScriptedGenerator gen(tok, [](const std::string&) { return kCall; });
    AgentLoopContext c = context_with(gen, tok);
    c.response_length = 150;  // one call (~86 ids) and its tool turn fit, the second call is cut
    const auto out = make_agent_loop("tool_agent", c)->run(sample_of("q"));
    CHECK(static_cast<int64_t>(out.response_ids.size()) <= 150);
    CHECK(out.metrics["cut_by_length"] == true);
    CHECK(out.metrics["cut_by_turns"] == false);
    CHECK(out.response_mask.size() == out.response_ids.size());
  }
}

namespace {
// Blocks its call until `release` (or 10 s) and says which came first.
class GateTool final : public Tool {
 public:
  GateTool() : Tool(ToolSchema{.name = "slow"}) {}
  ToolResult execute(const std::string&, const Json&) override {
    std::unique_lock lock(mu_);
    const bool released = cv_.wait_for(lock, std::chrono::seconds(10), [&] { return open_; });
    return {.text = released ? "released" : "timed out"};
  }
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};
}  // namespace

TEST_CASE("a slow tool does not stall the other samples", "[agents]") {
  auto tok = chat_tokenizer();
  auto gate = std::make_shared<GateTool>();
  std::atomic<int> finished_fast{0};
  ScriptedGenerator gen(tok, [&](const std::string& conv) {
    if (has(conv, "slow question")) {
      return has(conv, "<tool_response>")
                 ? std::string("slow done")
                 : std::string("<tool_call>\n{\"name\": \"slow\", \"arguments\": {}}\n</tool_call>");
    }
    // fast samples: one calculator turn, then the answer; the last one opens the gate
    if (!has(conv, "<tool_response>")) return kCall;
    if (++finished_fast == 3) gate->open();
    return std::string("fast done");
  });
  AgentLoopContext c = context_with(gen, tok);
  c.tools["slow"] = gate;
  std::vector<AgentSample> samples = {sample_of("slow question", "a"), sample_of("q1", "b"), sample_of("q2", "c"),
                                      sample_of("q3", "d")};
  const auto outputs = run_agent_loops(samples, c, "tool_agent", 4);
  REQUIRE(outputs.size() == 4);
  CHECK(has(tok->decode(outputs[0].response_ids), "released"));
  for (size_t i = 1; i < 4; ++i) CHECK(has(tok->decode(outputs[i].response_ids), "fast done"));
}

namespace {
class RetryInteraction final : public Interaction {
 public:
  RetryInteraction() : Interaction("retry") {}
  void start(const std::string& id, const Json& kwargs) override {
    std::lock_guard lock(mu_);
    truth_[id] = kwargs.at("ground_truth").get<std::string>();
  }
  InteractionTurn respond(const std::string& id, const ChatMessages& messages) override {
    std::lock_guard lock(mu_);
    const bool right = messages.back()["content"] == truth_[id];
    score_[id] = right ? 1.0 : 0.0;
    if (right) return {.terminate = true, .score = 1.0};
    return {.text = "Wrong, try again."};
  }
  double score(const std::string& id) override {
    std::lock_guard lock(mu_);
    return score_[id];
  }
  void finalize(const std::string& id) override {
    std::lock_guard lock(mu_);
    truth_.erase(id);
    ++finalized;
  }
  int finalized = 0;

 private:
  std::mutex mu_;
  std::map<std::string, std::string> truth_;
  std::map<std::string, double> score_;
};
}  // namespace

TEST_CASE("an interaction's user turns go in through the template, masked", "[agents]") {
  auto tok = chat_tokenizer();
  ScriptedGenerator gen(tok, [](const std::string& conv) { return has(conv, "Wrong") ? std::string("42") : "41"; });
  AgentLoopContext c = context_with(gen, tok);
  c.tools.clear();
  auto retry = std::make_shared<RetryInteraction>();
  c.interactions["retry"] = retry;
  AgentSample s = sample_of("6*7?");
  s.interaction_kwargs = {{"name", "retry"}, {"ground_truth", "42"}};
  const auto out = make_agent_loop("tool_agent", c)->run(s);
  const auto sampled = gen.sampled();
  REQUIRE(sampled.size() == 2);
  const auto user_turn = tok->encode("\n<|im_start|>user\nWrong, try again.<|im_end|>\n<|im_start|>assistant\n");
  std::vector<int64_t> expected = sampled[0];
  expected.insert(expected.end(), user_turn.begin(), user_turn.end());
  expected.insert(expected.end(), sampled[1].begin(), sampled[1].end());
  CHECK(out.response_ids == expected);
  CHECK(std::count(out.response_mask.begin(), out.response_mask.end(), 0) == static_cast<long>(user_turn.size()));
  CHECK(out.reward_scores["interaction"] == 1.0);
  CHECK(retry->finalized == 1);
  s.interaction_kwargs["name"] = "judge";
  CHECK_THROWS_WITH(make_agent_loop("tool_agent", c)->run(s), Catch::Contains("'judge'"));
}

TEST_CASE("agent outputs become verl's rollout batch", "[agents]") {
  AgentLoopOutput a{.prompt_ids = {5, 6},
                    .response_ids = {7, 8, 9},
                    .response_mask = {1, 0, 1},
                    .response_log_probs = {-0.5F, 0.0F, -0.25F},
                    .num_turns = 4};
  AgentLoopOutput b{.prompt_ids = {5, 6, 7},
                    .response_ids = {8},
                    .response_mask = {1},
                    .response_log_probs = {-1.0F},
                    .num_turns = 2};
  const DataProto d = agent_outputs_to_batch({a, b}, 3, 4, 0);
  const auto& t = d.batch;
  CHECK(torch::equal(t.at("prompts"), torch::tensor({{0, 5, 6}, {5, 6, 7}}, torch::kLong)));
  CHECK(torch::equal(t.at("responses"), torch::tensor({{7, 8, 9, 0}, {8, 0, 0, 0}}, torch::kLong)));
  CHECK(torch::equal(t.at("response_mask"), torch::tensor({{1, 0, 1, 0}, {1, 0, 0, 0}}, torch::kLong)));
  CHECK(torch::equal(t.at("attention_mask"),
                     torch::tensor({{0, 1, 1, 1, 1, 1, 0}, {1, 1, 1, 1, 0, 0, 0}}, torch::kLong)));
  CHECK(
      torch::equal(t.at("position_ids"), torch::tensor({{0, 0, 1, 2, 3, 4, 4}, {0, 1, 2, 3, 3, 3, 3}}, torch::kLong)));
  CHECK(torch::allclose(t.at("rollout_log_probs"),
                        torch::tensor({{-0.5F, 0.0F, -0.25F, 0.0F}, {-1.0F, 0.0F, 0.0F, 0.0F}})));
  CHECK(d.non_tensor_batch.find("__num_turns__")->second == dataproto::Column{4, 2});
  CHECK(d.non_tensor_batch.find("agent_metrics")->second.size() == 2);
  const Json m = agent_batch_metrics(d);
  CHECK(m["agent/masked_token_fraction"].get<double>() == Approx(0.25));
  CHECK(m["num_turns/max"] == 4);
  CHECK(m == agent_loop_metrics({a, b}));
  CHECK_THROWS_WITH(agent_outputs_to_batch({a}, 1, 4, 0), Catch::Contains("prompt has 2 ids"));
  CHECK_THROWS_WITH(agent_outputs_to_batch({a}, 3, 2, 0), Catch::Contains("response has 3 ids"));
}
