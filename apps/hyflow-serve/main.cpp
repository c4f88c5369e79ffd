// hyflow-serve --model <Hugging Face folder> | --tiny   [--host 127.0.0.1] [--port 8000] ...
//
// Serves one model over OpenAI's HTTP API (docs/rollout-server.md): POST /v1/chat/completions,
// POST /v1/completions, GET /v1/models, GET /health. Loopback by default; another --host needs
// --api-key-file. --enable-weight-update serves POST /v1/weights/update. --tiny serves the
// built-in tiny model (random weights, seeded) with a character tokenizer over printable ASCII,
// so that chat templates and tool JSON encode.
// --replicas N serves N engine loops behind a serve::Router; --route URL,... runs only a router.
// Runs until SIGINT or SIGTERM.
#include <hyflow/core/error.hpp>
#include <hyflow/metrics/server.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/config.hpp>
#include <hyflow/serve/router.hpp>
#include <hyflow/serve/server.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/trainer/dataset.hpp>

#include <torch/torch.h>
#include <boost/program_options.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

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

// SIGINT / SIGTERM end the server; blocked before any thread starts so only sigwait sees them.
sigset_t stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

void write_port_file(const po::variables_map& vm, int port) {
  if (!vm.count("port-file")) return;
  const auto path = vm["port-file"].as<std::string>();
  std::ofstream(path + ".tmp") << port << "\n";
  std::filesystem::rename(path + ".tmp", path);
}

int wait_for_signal(sigset_t signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  std::cout << "hyflow-serve: stopping (signal " << sig << ")" << std::endl;
  return 0;
}

// The router in front of `replicas` on --host / --port (--api-key-file: the clients' token and the
// one sent to the replicas).
serve::RouterOptions router_options(const po::variables_map& vm, std::vector<std::string> replicas) {
  serve::RouterOptions o;
  o.replicas = std::move(replicas);
  o.host = vm["host"].as<std::string>();
  o.port = vm["port"].as<int>();
  if (vm.count("api-key-file"))
    o.token = o.replica_token = hyflow::metrics::read_token_file(vm["api-key-file"].as<std::string>());
  o.max_body_bytes = vm["max-body-bytes"].as<size_t>();
  o.max_in_flight = vm["max-in-flight"].as<int64_t>() * static_cast<int64_t>(o.replicas.size());
  return o;
}

// --route URL,URL,...: only the router, in front of servers running elsewhere.
int route_main(const po::variables_map& vm) {
  std::vector<std::string> urls;
  std::stringstream list(vm["route"].as<std::string>());
  for (std::string url; std::getline(list, url, ',');)
    if (!url.empty()) urls.push_back(url);
  const auto signals = stop_signals();
  serve::Router router(router_options(vm, urls));
  std::cout << "hyflow-serve: routing over " << urls.size() << " replica(s) at " << router.base_url() << std::endl;
  write_port_file(vm, router.port());
  return wait_for_signal(signals);
}

int serve_main(const po::variables_map& vm) {
  if (vm.count("route")) return route_main(vm);
  const int64_t replicas = vm["replicas"].as<int64_t>();
  if (replicas < 1 || replicas > 64) throw hyflow::ValueError("--replicas must be in [1, 64]");
  hyflow::models::CausalLM model{nullptr};
  std::shared_ptr<const hyflow::tokenizers::Tokenizer> tokenizer;
  std::string name = vm["served-model-name"].as<std::string>();
  // one model per replica (each engine thread owns its own)
  auto load = [&]() -> std::pair<hyflow::models::CausalLM, std::shared_ptr<const hyflow::tokenizers::Tokenizer>> {
    if (vm.count("model")) {
      const auto dir = vm["model"].as<std::string>();
      auto m = hyflow::models::load_causal_lm(dir, {.dtype = at::kFloat});
      m->eval();
      return {m, hyflow::trainer::load_tokenizer(dir)};
    }
    if (vm["tiny"].as<bool>()) return tiny_model(vm["seed"].as<uint64_t>());
    throw hyflow::ValueError("give --model <folder>, --tiny or --route <urls>");
  };
  std::tie(model, tokenizer) = load();
  if (name.empty()) name = vm.count("model") ? std::filesystem::path(vm["model"].as<std::string>()).filename().string()
                                             : "hyflow-tiny";

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

  const auto signals = stop_signals();
  if (replicas == 1) {
    serve::EngineLoop loop(model, engine, loop_options);
    serve::Server server(loop, tokenizer, options);
    std::cout << "hyflow-serve: serving '" << name << "' at " << server.base_url() << std::endl;
    write_port_file(vm, server.port());
    return wait_for_signal(signals);
  }
  // --replicas N: N engine loops and servers on loopback ports, the router on --host / --port
  std::vector<std::unique_ptr<serve::EngineLoop>> loops;
  std::vector<std::unique_ptr<serve::Server>> servers;
  std::vector<std::string> urls;
  auto replica_options = options;
  replica_options.host = "127.0.0.1";
  replica_options.port = 0;
  for (int64_t r = 0; r < replicas; ++r) {
    auto m = r == 0 ? model : load().first;
    loops.push_back(std::make_unique<serve::EngineLoop>(m, engine, loop_options));
    servers.push_back(std::make_unique<serve::Server>(*loops.back(), tokenizer, replica_options));
    urls.push_back(servers.back()->base_url());
  }
  serve::Router router(router_options(vm, urls));
  std::cout << "hyflow-serve: serving '" << name << "' on " << replicas << " replicas behind " << router.base_url()
            << std::endl;
  write_port_file(vm, router.port());
  return wait_for_signal(signals);
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
      ("seed", po::value<uint64_t>()->default_value(0), "seed of requests without one, and of --tiny's weights")
      ("replicas", po::value<int64_t>()->default_value(1),
       "N > 1: N engine loops (one model copy each) on loopback ports behind a router on --host/--port")
      ("route", po::value<std::string>(),
       "URL,URL,...: only a router (session affinity, least in flight) in front of these servers' base URLs");
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
