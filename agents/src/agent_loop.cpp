#include <hyflow/agents/agent_loop.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/core/named_registry.hpp>
#include <hyflow/serve/tool_call_parser.hpp>
#include <hyflow/tokenizers/tokenizer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <mutex>
#include <thread>

namespace hyflow::agents {
namespace {

using Json = nlohmann::json;
using tokenizers::ChatMessage;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

tokenizers::ChatTemplateOptions chat_options(const AgentLoopContext& c, bool generation_prompt) {
  tokenizers::ChatTemplateOptions o = c.chat;
  o.add_generation_prompt = generation_prompt;
  o.tools.clear();
  if (c.list_tools)
    for (const auto& [name, tool] : c.tools) o.tools.push_back(nlohmann::ordered_json(tool->schema().to_openai()));
  return o;
}

std::vector<ChatMessage> to_messages(const Json& messages, const std::string& instance_id) {
  const std::string where = "agent sample '" + instance_id + "': messages";
  if (!messages.is_array() || messages.empty()) throw ValueError(where + ": expected a non-empty list of messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      throw ValueError(where + "[" + std::to_string(i) + "]: expected {\"role\": <string>, \"content\": <string>}");
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

void require_generator(const AgentLoopContext& c) {
  if (c.generator == nullptr || c.tokenizer == nullptr)
    throw ValueError("AgentLoopContext: the generator and the tokenizer must be set");
  if (c.response_length < 1) throw ValueError("AgentLoopContext: response_length must be >= 1");
}

Json base_metrics() {
  return {{"assistant_turns", 0},  {"user_turns", 0},         {"tool_calls", 0},       {"tool_calls_ok", 0},
          {"tool_calls_error", 0}, {"tool_calls_timeout", 0}, {"tool_latency_s", 0.0}, {"tool_latency_max_s", 0.0},
          {"generate_s", 0.0},     {"cut_by_turns", false},   {"cut_by_length", false}};
}

// Appends one generation to the output: the sampled ids with mask 1.
void append_sampled(AgentLoopOutput& out, const TokenResult& r) {
  out.response_ids.insert(out.response_ids.end(), r.ids.begin(), r.ids.end());
  out.response_mask.insert(out.response_mask.end(), r.ids.size(), 1);
  out.response_log_probs.insert(out.response_log_probs.end(), r.log_probs.begin(), r.log_probs.end());
}

TokenResult sample_turn(const AgentLoopContext& c, const std::vector<int64_t>& conversation, int64_t budget,
                        std::optional<uint64_t> seed, AgentLoopOutput& out) {
  const auto start = Clock::now();
  TokenResult r =
      c.generator->generate({.prompt = conversation, .max_tokens = budget, .sampling = c.sampling, .seed = seed});
  out.metrics["generate_s"] = out.metrics["generate_s"].get<double>() + seconds_since(start);
  if (r.ids.size() != r.log_probs.size() || static_cast<int64_t>(r.ids.size()) > budget)
    throw ValueError("TokenGenerator: returned " + std::to_string(r.ids.size()) + " ids and " +
                     std::to_string(r.log_probs.size()) + " log-probs for at most " + std::to_string(budget) + " ids");
  append_sampled(out, r);
  return r;
}

class SingleTurnAgentLoop final : public AgentLoop {
 public:
  using AgentLoop::AgentLoop;
  AgentLoopOutput run(const AgentSample& sample) override {
    const auto& c = context();
    require_generator(c);
    AgentLoopOutput out;
    out.metrics = base_metrics();
    out.prompt_ids = prompt_ids(sample);
    const TokenResult r = sample_turn(c, out.prompt_ids, c.response_length, sample.seed, out);
    out.metrics["assistant_turns"] = 1;
    out.metrics["cut_by_length"] = !r.stopped;
    out.num_turns = 2;
    return out;
  }
};

// One tool call's outcome, with its latency.
struct CallOutcome {
  ToolResult result;
  double latency_s = 0.0;
};

class ToolAgentLoop final : public AgentLoop {
 public:
  using AgentLoop::AgentLoop;

  AgentLoopOutput run(const AgentSample& sample) override {
    const auto& c = context();
    require_generator(c);
    AgentLoopOutput out;
    out.metrics = base_metrics();
    out.prompt_ids = prompt_ids(sample);
    Json messages = sample.messages;

    std::vector<std::string> created;
    std::shared_ptr<Interaction> interaction;
    std::string interaction_name;
    // Every created tool instance and the interaction are released, also after an error.
    auto release = [&] {
      for (const auto& name : created) c.tools.at(name)->release(sample.instance_id);
      if (interaction) interaction->finalize(sample.instance_id);
    };
    try {
      for (const auto& [name, tool] : c.tools) {
        Json kwargs = Json::object();
        if (sample.tools_kwargs.is_object() && sample.tools_kwargs.contains(name))
          kwargs = sample.tools_kwargs[name].value("create_kwargs", Json::object());
        tool->create(sample.instance_id, kwargs);
        created.push_back(name);
      }
      interaction = pick_interaction(sample, interaction_name);
      if (interaction) interaction->start(sample.instance_id, sample.interaction_kwargs);
      converse(sample, messages, interaction, out);
      for (const auto& name : created) out.reward_scores[name] = c.tools.at(name)->calc_reward(sample.instance_id);
      if (interaction) out.reward_scores["interaction"] = interaction->score(sample.instance_id);
    } catch (...) {
      release();
      throw;
    }
    release();
    out.num_turns = out.metrics["assistant_turns"].get<int64_t>() + out.metrics["user_turns"].get<int64_t>() + 1;
    return out;
  }

 private:
  std::shared_ptr<Interaction> pick_interaction(const AgentSample& sample, std::string& name) const {
    const auto& all = context().interactions;
    if (all.empty()) return nullptr;
    if (sample.interaction_kwargs.is_object() && sample.interaction_kwargs.contains("name")) {
      name = sample.interaction_kwargs["name"].is_string() ? sample.interaction_kwargs["name"].get<std::string>() : "";
      auto it = all.find(name);
      if (it == all.end())
        throw KeyError("agent sample '" + sample.instance_id + "': interaction_kwargs.name '" + name +
                       "' is not in the interaction config");
      return it->second;
    }
    if (all.size() != 1)
      throw KeyError("agent sample '" + sample.instance_id +
                     "': interaction_kwargs.name must choose one of the configured interactions");
    name = all.begin()->first;
    return all.begin()->second;
  }

  // Appends non-model ids (a tool or user turn); false when they do not fit the response length.
  bool append_turn(AgentLoopOutput& out, const std::vector<int64_t>& ids) const {
    if (static_cast<int64_t>(out.response_ids.size() + ids.size()) >= context().response_length) {
      out.metrics["cut_by_length"] = true;
      return false;
    }
    out.response_ids.insert(out.response_ids.end(), ids.begin(), ids.end());
    out.response_mask.insert(out.response_mask.end(), ids.size(), 0);
    out.response_log_probs.insert(out.response_log_probs.end(), ids.size(), 0.0F);
    out.metrics["user_turns"] = out.metrics["user_turns"].get<int64_t>() + 1;
    return true;
  }

  CallOutcome call_tool(const std::string& instance_id, const serve::ParsedToolCall& call) const {
    const auto start = Clock::now();
    CallOutcome outcome;
    auto it = context().tools.find(call.name);
    if (it == context().tools.end()) {
      outcome.result = {.text = "Error: no tool named '" + call.name + "'", .status = ToolStatus::error};
    } else {
      try {
        outcome.result = it->second->execute(instance_id, Json::parse(call.arguments));
      } catch (const std::exception& e) {
        outcome.result = {.text = std::string("Error: ") + e.what(), .status = ToolStatus::error};
      }
    }
    outcome.latency_s = seconds_since(start);
    return outcome;
  }

  // Runs the calls of one turn at once (each on its own thread) and returns the tool messages.
  std::vector<ChatMessage> run_calls(const AgentSample& sample, std::vector<serve::ParsedToolCall> calls,
                                     AgentLoopOutput& out) const {
    const auto& c = context();
    if (static_cast<int64_t>(calls.size()) > c.multi_turn.max_parallel_calls)
      calls.resize(static_cast<size_t>(c.multi_turn.max_parallel_calls));
    std::vector<std::future<CallOutcome>> futures;
    for (const auto& call : calls)
      futures.push_back(
          std::async(std::launch::async, [this, &sample, call] { return call_tool(sample.instance_id, call); }));
    std::vector<ChatMessage> tool_messages;
    Json& m = out.metrics;
    for (auto& f : futures) {
      CallOutcome o = f.get();
      m["tool_calls"] = m["tool_calls"].get<int64_t>() + 1;
      const char* key = o.result.status == ToolStatus::ok      ? "tool_calls_ok"
                        : o.result.status == ToolStatus::error ? "tool_calls_error"
                                                               : "tool_calls_timeout";
      m[key] = m[key].get<int64_t>() + 1;
      m["tool_latency_s"] = m["tool_latency_s"].get<double>() + o.latency_s;
      m["tool_latency_max_s"] = std::max(m["tool_latency_max_s"].get<double>(), o.latency_s);
      tool_messages.push_back({"tool", truncate_tool_response(o.result.text, c.multi_turn.max_tool_response_length,
                                                              c.multi_turn.tool_response_truncate_side)});
    }
    return tool_messages;
  }

  void converse(const AgentSample& sample, Json& messages, const std::shared_ptr<Interaction>& interaction,
                AgentLoopOutput& out) const {
    const auto& c = context();
    const auto& mt = c.multi_turn;
    std::vector<int64_t> conversation = out.prompt_ids;
    for (uint64_t turn = 0;; ++turn) {
      const int64_t budget = c.response_length - static_cast<int64_t>(out.response_ids.size());
      if (budget <= 0) {
        out.metrics["cut_by_length"] = true;
        return;
      }
      const TokenResult r =
          sample_turn(c, conversation, budget, sample.seed ? std::optional(*sample.seed + turn) : std::nullopt, out);
      conversation.insert(conversation.end(), r.ids.begin(), r.ids.end());
      const int64_t assistant_turns = out.metrics["assistant_turns"].get<int64_t>() + 1;
      out.metrics["assistant_turns"] = assistant_turns;
      if (!r.stopped) {
        out.metrics["cut_by_length"] = true;
        return;
      }
      // another end token than the template's (e.g. <|endoftext|>): no turn can follow it
      if (r.ids.back() != c.tokenizer->eos_token_id()) return;
      const std::string text = c.tokenizer->decode(r.ids, /*skip_special_tokens=*/true);
      serve::ParsedOutput parsed = serve::parse_tool_calls(text);
      const bool calls = !parsed.tool_calls.empty() && !c.tools.empty();
      if (!calls && !interaction) return;  // the answer
      if (mt.max_assistant_turns && assistant_turns >= *mt.max_assistant_turns) {
        out.metrics["cut_by_turns"] = true;
        return;
      }
      if (mt.max_user_turns && out.metrics["user_turns"].get<int64_t>() >= *mt.max_user_turns) {
        out.metrics["cut_by_turns"] = true;
        return;
      }
      std::vector<ChatMessage> next;
      Json assistant = {{"role", "assistant"}, {"content", text}};
      messages.push_back(assistant);
      if (calls) {
        next = run_calls(sample, std::move(parsed.tool_calls), out);
        for (const auto& m : next) messages.push_back({{"role", m.role}, {"content", m.content}});
      } else {
        InteractionTurn reply = interaction->respond(sample.instance_id, messages);
        if (reply.terminate) return;
        next.push_back({"user", reply.text});
        messages.push_back({{"role", "user"}, {"content", reply.text}});
      }
      const std::vector<int64_t> ids = template_turn_ids(c, next);
      if (!append_turn(out, ids)) return;
      conversation.insert(conversation.end(), ids.begin(), ids.end());
    }
  }
};

NamedRegistry<AgentLoopFactory>& loops() {
  static NamedRegistry<AgentLoopFactory> registry(
      "agent loop (agent_name, actor_rollout_ref.rollout.agent.default_agent_loop)",
      {{"single_turn_agent", [](const AgentLoopContext& c) { return std::make_unique<SingleTurnAgentLoop>(c); }},
       {"tool_agent", [](const AgentLoopContext& c) { return std::make_unique<ToolAgentLoop>(c); }}});
  return registry;
}

}  // namespace

std::vector<int64_t> AgentLoop::prompt_ids(const AgentSample& sample) const {
  const std::string text =
      tokenizers::apply_chatml(to_messages(sample.messages, sample.instance_id), chat_options(context_, true));
  std::vector<int64_t> ids = context_.tokenizer->encode(text);
  if (context_.prompt_length > 0 && static_cast<int64_t>(ids.size()) > context_.prompt_length)
    throw ValueError("agent sample '" + sample.instance_id + "': the prompt (chat template with the tools) has " +
                     std::to_string(ids.size()) + " ids, more than the prompt length " +
                     std::to_string(context_.prompt_length));
  return ids;
}

std::vector<int64_t> template_turn_ids(const AgentLoopContext& context, const std::vector<ChatMessage>& messages) {
  // A stand-in conversation ending on an assistant turn: what the template adds for `messages`
  // does not depend on the earlier turns' contents.
  std::vector<ChatMessage> base = {{"user", "u"}, {"assistant", "a"}};
  const std::string before = tokenizers::apply_chatml(base, chat_options(context, false));
  base.insert(base.end(), messages.begin(), messages.end());
  const std::string after = tokenizers::apply_chatml(base, chat_options(context, true));
  const std::string end = context.tokenizer->decode({context.tokenizer->eos_token_id()});
  const size_t at = before.rfind(end);
  if (after.compare(0, before.size(), before) != 0 || at == std::string::npos || before.rfind("a", at) + 1 != at)
    throw ValueError("chat template: an assistant turn does not end on the tokenizer's end token '" + end +
                     "', so tool and user turns cannot be appended after the sampled ids");
  return context.tokenizer->encode(before.substr(at + end.size()) + after.substr(before.size()));
}

void register_agent_loop(const std::string& name, AgentLoopFactory factory) {
  if (name.empty()) throw ValueError("register_agent_loop: the name is empty");
  loops().put(name, std::move(factory), /*overwrite=*/true);
}

bool has_agent_loop(const std::string& name) {
  return loops().contains(name);
}

std::vector<std::string> agent_loop_names() {
  return loops().names();
}

std::unique_ptr<AgentLoop> make_agent_loop(const std::string& name, const AgentLoopContext& context) {
  auto loop = loops().get(name)(context);
  if (!loop) throw ValueError("agent loop '" + name + "': its factory returned nothing");
  return loop;
}

std::vector<AgentLoopOutput> run_agent_loops(const std::vector<AgentSample>& samples, const AgentLoopContext& context,
                                             const std::string& default_loop, int64_t num_workers) {
  if (num_workers < 1) throw ValueError("run_agent_loops: num_workers must be >= 1");
  for (const auto& s : samples) make_agent_loop(s.agent_name.empty() ? default_loop : s.agent_name, context);
  std::vector<AgentLoopOutput> outputs(samples.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr failure;
  size_t failed_at = 0;
  auto work = [&] {
    for (size_t i = next++; i < samples.size(); i = next++) {
      try {
        const auto& s = samples[i];
        outputs[i] = make_agent_loop(s.agent_name.empty() ? default_loop : s.agent_name, context)->run(s);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!failure || i < failed_at) {
          failure = std::current_exception();
          failed_at = i;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  const auto n = std::min<size_t>(static_cast<size_t>(num_workers), samples.size());
  for (size_t t = 0; t < n; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      throw ValueError("agent loop of sample " + std::to_string(failed_at) + ": " + e.what());
    }
  }
  return outputs;
}

Json agent_loop_metrics(const std::vector<AgentLoopOutput>& outputs) {
  Json m = Json::object();
  if (outputs.empty()) return m;
  const double n = static_cast<double>(outputs.size());
  int64_t turns_min = outputs[0].num_turns, turns_max = turns_min, calls_max = 0;
  double turns = 0, calls = 0, ok = 0, error = 0, timeout = 0, latency = 0, latency_max = 0, masked = 0, tokens = 0,
         cut_turns = 0, cut_length = 0;
  for (const auto& o : outputs) {
    turns_min = std::min(turns_min, o.num_turns);
    turns_max = std::max(turns_max, o.num_turns);
    turns += static_cast<double>(o.num_turns);
    const auto& x = o.metrics;
    const int64_t c = x.value("tool_calls", int64_t{0});
    calls += static_cast<double>(c);
    calls_max = std::max(calls_max, c);
    ok += x.value("tool_calls_ok", 0.0);
    error += x.value("tool_calls_error", 0.0);
    timeout += x.value("tool_calls_timeout", 0.0);
    latency += x.value("tool_latency_s", 0.0);
    latency_max = std::max(latency_max, x.value("tool_latency_max_s", 0.0));
    tokens += static_cast<double>(o.response_mask.size());
    masked += static_cast<double>(std::count(o.response_mask.begin(), o.response_mask.end(), 0));
    cut_turns += x.value("cut_by_turns", false) ? 1 : 0;
    cut_length += x.value("cut_by_length", false) ? 1 : 0;
  }
  m["num_turns/min"] = turns_min;
  m["num_turns/max"] = turns_max;
  m["num_turns/mean"] = turns / n;
  m["agent/tool_calls/mean"] = calls / n;
  m["agent/tool_calls/max"] = calls_max;
  m["agent/tool_success_rate"] = calls > 0 ? ok / calls : 0.0;
  m["agent/tool_error_rate"] = calls > 0 ? error / calls : 0.0;
  m["agent/tool_timeout_rate"] = calls > 0 ? timeout / calls : 0.0;
  m["agent/tool_latency_s/mean"] = calls > 0 ? latency / calls : 0.0;
  m["agent/tool_latency_s/max"] = latency_max;
  m["agent/masked_token_fraction"] = tokens > 0 ? masked / tokens : 0.0;
  m["agent/cut_by_turns"] = cut_turns / n;
  m["agent/cut_by_length"] = cut_length / n;
  return m;
}

}  // namespace hyflow::agents
