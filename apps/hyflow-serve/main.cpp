// hyflow-serve --model <Hugging Face folder> | --tiny   [--host 127.0.0.1] [--port 8000] ...
//
// Serves one model over OpenAI's HTTP API (docs/rollout-server.md): POST /v1/chat/completions,
// POST /v1/completions, GET /v1/models, GET /health. Loopback by default; another --host needs
// --api-key-file. --enable-weight-update serves POST /v1/weights/update. --tiny serves the
// built-in tiny model (random weights, seeded) with a character tokenizer over printable ASCII,
// so that chat templates and tool JSON encode.
// Runs until SIGINT or SIGTERM.
#include <hyflow/core/error.hpp>
#include <hyflow/metrics/server.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/config.hpp>
#include <hyflow/serve/server.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/trainer/dataset.hpp>

#include <torch/torch.h>
#include <boost/program_options.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace po = boost::program_options;
namespace serve = hyflow::serve;

namespace {

hyflow::tokenizers::ChatTemplate template_named(const std::string& name) {
  using hyflow::tokenizers::ChatTemplate;
  if (name == "qwen2.5") return ChatTemplate::kQwen2_5;
  if (name == "chatml") return ChatTemplate::kChatML;
  if (name == "llama3.1") return ChatTemplate::kLlama3_1;
  if (name == "llama3") return ChatTemplate::kLlama3;
  throw hyflow::ValueError("--chat-template must be qwen2.5, chatml, llama3.1 or llama3, got '" + name + "'");
}

// The built-in tiny model: models::tiny_config over a character tokenizer of printable ASCII.
std::pair<hyflow::models::CausalLM, std::shared_ptr<const hyflow::tokenizers::Tokenizer>> tiny_model(uint64_t seed) {
  hyflow::tokenizers::CharTokenizerOptions o;
  o.alphabet.clear();
  for (char c = ' '; c <= '~'; ++c) o.alphabet.push_back(c);
  o.alphabet += "\n";
  auto tokenizer = std::make_shared<hyflow::tokenizers::CharTokenizer>(o);
  torch::manual_seed(seed);
  hyflow::models::CausalLM model(
      hyflow::models::tiny_config(tokenizer->vocab_size(), tokenizer->pad_token_id(), tokenizer->eos_token_id()));
  model->eval();
  return {model, tokenizer};
}

int serve_main(const po::variables_map& vm) {
  hyflow::models::CausalLM model{nullptr};
  std::shared_ptr<const hyflow::tokenizers::Tokenizer> tokenizer;
  std::string name = vm["served-model-name"].as<std::string>();
  if (vm.count("model")) {
    const auto dir = vm["model"].as<std::string>();
    model = hyflow::models::load_causal_lm(dir, {.dtype = at::kFloat});
    model->eval();
    tokenizer = hyflow::trainer::load_tokenizer(dir);
    if (name.empty()) name = std::filesystem::path(dir).filename().string();
  } else if (vm["tiny"].as<bool>()) {
    std::tie(model, tokenizer) = tiny_model(vm["seed"].as<uint64_t>());
    if (name.empty()) name = "hyflow-tiny";
  } else {
    throw hyflow::ValueError("give --model <folder> or --tiny");
  }

  serve::ServeOptions options;
  options.host = vm["host"].as<std::string>();
  options.port = vm["port"].as<int>();
  if (vm.count("api-key-file")) options.token = hyflow::metrics::read_token_file(vm["api-key-file"].as<std::string>());
  options.served_model_name = name;
  options.max_body_bytes = vm["max-body-bytes"].as<size_t>();
  options.limits.max_tokens = vm["max-tokens"].as<int64_t>();
  options.limits.default_max_tokens = std::min(options.limits.default_max_tokens, options.limits.max_tokens);
  options.chat.chat_template = template_named(vm["chat-template"].as<std::string>());
  options.reject_during_weight_update = vm["reject-during-weight-update"].as<bool>();
  options.weight_update_mode = serve::weight_update_mode_named(vm["weight-update-mode"].as<std::string>());
  options.enable_weight_update = vm["enable-weight-update"].as<bool>();
  options.stream_interval_ms = vm["stream-interval-ms"].as<int>();

  // Ends of an assistant turn: the tokenizer's and the model's end tokens, and the template's
  // end marker: a token when the tokenizer has one, else a stop string.
  serve::EngineLoopOptions loop_options;
  loop_options.max_positions = vm["max-positions"].as<int64_t>();
  loop_options.max_in_flight = vm["max-in-flight"].as<int64_t>();
  loop_options.seed = vm["seed"].as<uint64_t>();
  auto& eos = loop_options.eos_token_ids;
  eos.push_back(tokenizer->eos_token_id());
  for (auto id : model->config().eos_token_ids) eos.push_back(id);
  const bool llama = options.chat.chat_template == hyflow::tokenizers::ChatTemplate::kLlama3_1 ||
                     options.chat.chat_template == hyflow::tokenizers::ChatTemplate::kLlama3;
  const std::string end_marker = llama ? "<|eot_id|>" : "<|im_end|>";
  if (auto id = tokenizer->token_to_id(end_marker)) {
    eos.push_back(*id);
  } else {
    options.chat_stop.push_back(end_marker);
  }
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());

  hyflow::inference::DecodeEngineOptions engine;
  engine.max_batch = vm["max-batch"].as<int64_t>();
  engine.kv_cache_bytes = vm["kv-cache-bytes"].as<int64_t>();

  // SIGINT / SIGTERM end the server; blocked before any thread starts so only sigwait sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  serve::EngineLoop loop(model, engine, loop_options);
  serve::Server server(loop, tokenizer, options);
  std::cout << "hyflow-serve: serving '" << name << "' at " << server.base_url() << std::endl;
  if (vm.count("port-file")) {
    const auto path = vm["port-file"].as<std::string>();
    std::ofstream(path + ".tmp") << server.port() << "\n";
    std::filesystem::rename(path + ".tmp", path);
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::cout << "hyflow-serve: stopping (signal " << sig << ")" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("hyflow-serve options");
  // clang-format off
  desc.add_options()
      ("help", "this help")
      ("model", po::value<std::string>(), "Hugging Face model folder (config.json, safetensors, tokenizer)")
      ("tiny", po::bool_switch()->default_value(false), "serve the built-in tiny model (random weights, --seed)")
      ("served-model-name", po::value<std::string>()->default_value(""),
       "the model id of /v1/models (default: folder name)")
      ("host", po::value<std::string>()->default_value("127.0.0.1"),
       "address to bind; non-loopback needs --api-key-file")
      ("port", po::value<int>()->default_value(8000), "port (0: a free one, see --port-file)")
      ("port-file", po::value<std::string>(), "write the bound port here once listening")
      ("api-key-file", po::value<std::string>(), "file holding the bearer token every request must carry")
      ("chat-template", po::value<std::string>()->default_value("qwen2.5"), "qwen2.5, chatml, llama3.1 or llama3")
      ("max-batch", po::value<int64_t>()->default_value(32), "sequences decoding at once (verl's max_num_seqs)")
      ("max-positions", po::value<int64_t>()->default_value(1024), "prompt + max_tokens of one request")
      ("max-tokens", po::value<int64_t>()->default_value(1024), "largest max_tokens a request may ask")
      ("max-in-flight", po::value<int64_t>()->default_value(64), "requests queued or running (429 beyond)")
      ("max-body-bytes", po::value<size_t>()->default_value(size_t{1} << 20), "largest request body (413 beyond)")
      ("kv-cache-bytes", po::value<int64_t>()->default_value(0), "cap of the KV pool in bytes (0: none)")
      ("reject-during-weight-update", po::bool_switch()->default_value(false),
       "answer 503 + Retry-After during a weight update instead of queueing")
      ("weight-update-mode", po::value<std::string>()->default_value("drain"),
       "running requests during a weight update: drain (finish on the old weights) or partial (pause, resume)")
      ("enable-weight-update", po::bool_switch()->default_value(false),
       "serve POST /v1/weights/update (loads weight files named by the client; off by default)")
      ("stream-interval-ms", po::value<int>()->default_value(0),
       "streaming: gather tokens this long after a chunk's first (0: a chunk per step)")
      ("seed", po::value<uint64_t>()->default_value(0), "seed of requests without one, and of --tiny's weights");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "hyflow-serve: " << e.what() << "\n" << desc;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  try {
    return serve_main(vm);
  } catch (const std::exception& e) {
    std::cerr << "hyflow-serve: " << e.what() << "\n";
    return 1;
  }
}
