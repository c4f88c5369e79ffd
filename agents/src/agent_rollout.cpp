#include <hyflow/agents/agent_batch.hpp>
#include <hyflow/agents/agent_loop.hpp>
#include <hyflow/agents/agent_rollout.hpp>
#include <hyflow/agents/tool_plugins.hpp>
#include <hyflow/agents/token_generator.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/serve/engine_loop.hpp>

#include <torch/torch.h>

namespace hyflow::agents {

namespace {

const dataproto::Column* column(const DataProto& d, const char* key) {
  auto it = d.non_tensor_batch.find(key);
  return it == d.non_tensor_batch.end() ? nullptr : &it->second;
}

nlohmann::json messages_of(const nlohmann::json& raw, int64_t row) {
  if (raw.is_string()) return nlohmann::json::array({{{"role", "user"}, {"content", raw}}});
  if (raw.is_array()) return raw;
  throw ValueError("agent rollout: raw_prompt of row " + std::to_string(row) +
                   " must be a string or a list of messages, got " + raw.dump());
}

}  // namespace

AgentRollout::AgentRollout(const nlohmann::json& rollout, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
                           tokenizers::ChatTemplateOptions chat)
    : multi_turn_(parse_multi_turn_config(rollout)),
      agent_(parse_agent_config(rollout)),
      tokenizer_(std::move(tokenizer)),
      chat_(std::move(chat)) {
  if (rollout.is_object() && rollout.contains("prompt_length") && !rollout.at("prompt_length").is_null()) {
    const auto& p = rollout.at("prompt_length");
    if (!p.is_number_integer() || p.get<int64_t>() < 1)
      throw ValueError("actor_rollout_ref.rollout.prompt_length: expected an integer >= 1, got " + p.dump());
    prompt_length_ = p.get<int64_t>();
  }
  if (!tokenizer_) throw ValueError("AgentRollout: no tokenizer");
  const ChatTemplateKwargs kwargs = parse_chat_template_kwargs(rollout);
  if (kwargs.default_system) chat_.default_system = kwargs.default_system;
  list_tools_ = kwargs.list_tools;
  if (!multi_turn_.tool_plugins.empty()) load_tool_plugins(multi_turn_.tool_plugins);
  if (!multi_turn_.tool_config_path.empty()) tools_ = load_tool_config(multi_turn_.tool_config_path);
  if (!multi_turn_.interaction_config_path.empty())
    interactions_ = load_interaction_config(multi_turn_.interaction_config_path);
  if (!has_agent_loop(agent_.default_agent_loop)) {
    std::string known;
    for (const auto& name : agent_loop_names()) known += (known.empty() ? "" : ", ") + name;
    throw KeyError("actor_rollout_ref.rollout.agent.default_agent_loop: unknown agent loop '" +
                   agent_.default_agent_loop + "' (registered: " + known + ")");
  }
}

DataProto AgentRollout::generate(models::CausalLM model, const DataProto& prompts,
                                 const inference::GenerationOptions& options) {
  const at::Tensor input_ids = prompts.batch.at("input_ids");
  const int64_t B = input_ids.size(0), P = prompt_length_.value_or(input_ids.size(1)), R = options.max_new_tokens;
  const auto* raw = column(prompts, "raw_prompt");
  if (raw == nullptr)
    throw ValueError(
        "agent rollout (actor_rollout_ref.rollout.multi_turn.enable): the prompts lack the raw_prompt "
        "column (data.return_raw_chat)");
  const auto* names = column(prompts, "agent_name");
  const auto* tools_kwargs = column(prompts, "tools_kwargs");
  const auto* interaction_kwargs = column(prompts, "interaction_kwargs");
  std::vector<AgentSample> samples(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    const auto k = static_cast<size_t>(i);
    AgentSample& s = samples[k];
    s.messages = messages_of(raw->at(k), i);
    if (names && names->at(k).is_string()) s.agent_name = names->at(k).get<std::string>();
    if (tools_kwargs && tools_kwargs->at(k).is_object()) s.tools_kwargs = tools_kwargs->at(k);
    if (interaction_kwargs && interaction_kwargs->at(k).is_object()) s.interaction_kwargs = interaction_kwargs->at(k);
    s.instance_id = "row" + std::to_string(i);
  }

  serve::EngineLoopOptions loop_options;
  loop_options.max_positions = P + R;
  loop_options.max_in_flight = std::max<int64_t>(B, 1) + 1;
  loop_options.eos_token_ids = options.eos_token_ids;
  const int64_t eos = tokenizer_->eos_token_id();
  if (std::find(loop_options.eos_token_ids.begin(), loop_options.eos_token_ids.end(), eos) ==
      loop_options.eos_token_ids.end())
    loop_options.eos_token_ids.push_back(eos);
  loop_options.seed = options.seed;
  std::vector<AgentLoopOutput> outputs;
  {
    serve::EngineLoop loop(model, options.decode, loop_options);
    auto generator = make_engine_loop_generator(loop);
    AgentLoopContext context;
    context.generator = generator.get();
    context.tokenizer = tokenizer_;
    context.chat = chat_;
    context.list_tools = list_tools_;
    context.multi_turn = multi_turn_;
    context.tools = tools_;
    context.interactions = interactions_;
    context.response_length = R;
    context.prompt_length = P;
    const auto& so = options.sampling;
    context.sampling = options.do_sample ? TokenSampling{.greedy = so.greedy,
                                                         .temperature = so.temperature,
                                                         .top_k = so.top_k,
                                                         .top_p = so.top_p,
                                                         .min_p = so.min_p}
                                         : TokenSampling{.greedy = true};
    try {
      outputs = run_agent_loops(samples, context, agent_.default_agent_loop, agent_.num_workers);
      const serve::EngineLoopStats st = loop.stats();
      last_stats_ = {{"runs", st.runs},
                     {"admitted", st.admitted},
                     {"joined_mid_run", st.joined_mid_run},
                     {"tokens", st.tokens},
                     {"peak_running", st.peak_running}};
    } catch (const ValueError& e) {
      if (std::string(e.what()).find("more than the prompt length") == std::string::npos) throw;
      throw ValueError(std::string(e.what()) + " (actor_rollout_ref.rollout." +
                       (prompt_length_ ? "prompt_length)" : "prompt_length, unset: the prompts' width)"));
    }
  }
  const int64_t pad = options.pad_token_id >= 0 ? options.pad_token_id : tokenizer_->pad_token_id();
  DataProto out = agent_outputs_to_batch(outputs, P, R, pad);
  for (const auto& [key, values] : prompts.non_tensor_batch)
    if (!out.non_tensor_batch.contains(key)) out.non_tensor_batch[key] = values;
  out.meta_info = prompts.meta_info;
  return out;
}

void copy_agent_columns(const DataProto& from, DataProto& to) {
  for (const char* key : {"raw_prompt", "agent_name", "tools_kwargs", "interaction_kwargs"})
    if (const auto* values = column(from, key)) to.non_tensor_batch[key] = *values;
}

nlohmann::json agent_batch_metrics(const DataProto& batch) {
  const auto* metrics = column(batch, "agent_metrics");
  const auto* turns = column(batch, "__num_turns__");
  if (metrics == nullptr || turns == nullptr) return nlohmann::json::object();
  const at::Tensor responses = batch.batch.at("responses");
  const int64_t R = responses.size(1);
  const at::Tensor attn = batch.batch.at("attention_mask").narrow(1, -R, R).to(torch::kLong).contiguous();
  const at::Tensor mask = batch.batch.at("response_mask").to(torch::kLong).contiguous();
  auto a = attn.accessor<int64_t, 2>();
  auto m = mask.accessor<int64_t, 2>();
  std::vector<AgentLoopOutput> outputs(metrics->size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i].num_turns = turns->at(i).get<int64_t>();
    outputs[i].metrics = metrics->at(i);
    for (int64_t j = 0; j < R; ++j)
      if (a[static_cast<int64_t>(i)][j] != 0) outputs[i].response_mask.push_back(m[static_cast<int64_t>(i)][j]);
  }
  return agent_loop_metrics(outputs);
}

}  // namespace hyflow::agents
