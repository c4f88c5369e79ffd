// The HTTP side of hyflow::serve: cpp-httplib handlers that turn OpenAI request bodies into
// GenerationJobs on the EngineLoop, and the jobs' token events into OpenAI responses (one JSON
// body, or server-sent events).
#include <hyflow/serve/server.hpp>

#include "http_front.hpp"
#include "choice_state.hpp"

#include <hyflow/metrics/server.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/serve/api_error.hpp>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <thread>

namespace hyflow::serve {
namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void send_json(httplib::Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e, int retry_after_s = 0) {
  if (e.status() == 503 || e.status() == 429) res.set_header("Retry-After", std::to_string(std::max(1, retry_after_s)));
  send_json(res, e.status(), ojson(error_body(e)));
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct Server::Impl {
  EngineLoop& loop;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
  ServeOptions options;
  SessionStore sessions;
  httplib::Server http;
  std::thread thread;
  int port = 0;
  std::atomic<uint64_t> next_id{0};

  Impl(EngineLoop& l, std::shared_ptr<const tokenizers::Tokenizer> t, ServeOptions o)
      : loop(l), tokenizer(std::move(t)), options(std::move(o)), sessions(options.sessions) {}

  // What a prepared request runs: its prompt ids, its job and how its choices are read.
  struct Call {
    bool chat = false;
    SamplingRequest request;
    std::vector<int64_t> prompt_ids;
    std::vector<std::string> stop;
    bool parse_tools = false;
    std::string session;
    std::string id;
    int64_t created = 0;
    std::shared_ptr<GenerationJob> job;
  };

  ojson parse_body(const httplib::Request& req) const {
    auto body = ojson::parse(req.body, nullptr, false);
    if (body.is_discarded()) throw bad_request("", "the request body is not valid JSON");
    if (!body.is_object()) throw bad_request("", "the request body must be a JSON object");
    return body;
  }

  std::vector<int64_t> encode(const std::string& text, const std::string& param) const {
    try {
      return tokenizer->encode(text);
    } catch (const ValueError& e) {
      throw bad_request(param, param + " cannot be tokenized: " + e.what());
    }
  }

  void check_model(const std::string& model) const {
    if (!model.empty() && model != options.served_model_name) {
      throw ApiError(
          404, "not_found_error", "model",
          "the model '" + model + "' does not exist; this server serves '" + options.served_model_name + "'");
    }
  }

  // Submits the call's job: the session tag, max_tokens by default what the context leaves, the
  // weight-update policy.
  void submit(Call& call, const httplib::Request& req) {
    check_model(call.request.model);
    call.session = req.has_header("X-Session-Id") ? req.get_header_value("X-Session-Id") : call.request.user;
    if (!call.session.empty()) sessions.check_id(call.session);
    const auto len = static_cast<int64_t>(call.prompt_ids.size());
    const int64_t room = loop.options().max_positions - 1 - len;
    if (room <= 0) {
      throw bad_request(call.chat ? "messages" : "prompt",
                        "the prompt has " + std::to_string(len) + " tokens; the server holds " +
                            std::to_string(loop.options().max_positions) + " positions per request");
    }
    const int64_t max_tokens = call.request.max_tokens.value_or(std::min(options.limits.default_max_tokens, room));
    if (options.reject_during_weight_update && loop.updating_weights()) {
      throw ApiError(503, "server_error", "", "the weights are being updated; retry shortly");
    }
    call.id = (call.chat ? "chatcmpl-" : "cmpl-") + std::to_string(unix_time()) + "-" + std::to_string(next_id++);
    call.created = unix_time();
    call.job = loop.submit(GenerationSpec{.prompt = call.prompt_ids,
                                          .n = call.request.n,
                                          .max_tokens = max_tokens,
                                          .sampling = call.request.sampling,
                                          .seed = call.request.seed,
                                          .ignore_eos = call.request.ignore_eos,
                                          .top_logprobs = call.request.top_logprobs});
  }

  Call prepare_chat(const httplib::Request& req) {
    const auto body = parse_body(req);
    auto r = parse_chat_request(body, options.limits);
    Call call;
    call.chat = true;
    auto chat = options.chat;
    call.parse_tools = !r.tools.empty() && !r.tool_choice_none;
    if (call.parse_tools) chat.tools = r.tools;
    std::string text;
    try {
      text = tokenizers::apply_chatml(r.messages, chat);
    } catch (const ValueError& e) {
      throw bad_request(r.tools.empty() ? "messages" : "tools", std::string("the chat template refused: ") + e.what());
    }
    call.prompt_ids = encode(text, "messages");
    call.stop = r.stop;
    call.stop.insert(call.stop.end(), options.chat_stop.begin(), options.chat_stop.end());
    call.request = std::move(r);
    submit(call, req);
    return call;
  }

  Call prepare_completion(const httplib::Request& req) {
    const auto body = parse_body(req);
    auto r = parse_completion_request(body, options.limits);
    Call call;
    call.prompt_ids = r.prompt_text ? encode(*r.prompt_text, "prompt") : r.prompt_ids;
    call.stop = r.stop;
    call.request = std::move(r);
    submit(call, req);
    return call;
  }

  std::vector<ChoiceState> choices_of(const Call& call) const {
    std::vector<ChoiceState> out;
    for (int64_t i = 0; i < call.request.n; ++i) {
      out.emplace_back(*tokenizer, call.stop,
                       call.request.ignore_eos ? std::vector<int64_t>{} : loop.options().eos_token_ids,
                       call.parse_tools);
    }
    return out;
  }

  // Feeds events to the choices; a stop string ends the sample in the engine too.
  void feed(const Call& call, std::vector<ChoiceState>& choices, const std::vector<TokenEvent>& events) {
    for (const auto& e : events) {
      auto& c = choices[static_cast<size_t>(e.sample)];
      const bool was_finished = c.finished();
      c.add(e);
      if (!was_finished && c.finished()) {
        if (!e.last) call.job->stop_sample(e.sample);
        record(call, c);
      }
    }
  }

  void record(const Call& call, const ChoiceState& c) {
    if (call.session.empty()) return;
    sessions.record(call.session, Turn{.prompt_ids = call.prompt_ids,
                                       .completion_ids = c.tokens(),
                                       .completion_log_probs = c.log_probs(),
                                       .weight_version = c.weight_versions().empty() ? call.job->weight_version()
                                                                                     : c.weight_versions().front(),
                                       .completion_weight_versions = c.weight_versions()});
  }

  ojson usage(const Call& call, const std::vector<ChoiceState>& choices) const {
    int64_t completion = 0;
    for (const auto& c : choices) completion += static_cast<int64_t>(c.tokens().size());
    const auto prompt = static_cast<int64_t>(call.prompt_ids.size());
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  }

  ojson header(const Call& call, const char* object) const {
    ojson j;
    j["id"] = call.id;
    j["object"] = object;
    j["created"] = call.created;
    j["model"] = options.served_model_name;
    return j;
  }

  void respond(const Call& call, httplib::Response& res) {
    auto choices = choices_of(call);
    feed(call, choices, call.job->wait_all());
    if (!call.job->error().empty()) throw ApiError(500, "server_error", "", call.job->error());
    auto out = header(call, call.chat ? "chat.completion" : "text_completion");
    out["choices"] = ojson::array();
    for (size_t i = 0; i < choices.size(); ++i) {
      const auto& c = choices[i];
      ojson choice{{"index", i}};
      if (call.chat) {
        choice["message"] = c.message();
        choice["logprobs"] = call.request.logprobs ? c.chat_logprobs(0) : ojson(nullptr);
      } else {
        choice["text"] = c.text();
        const bool top = call.request.top_logprobs > 0;
        choice["logprobs"] = call.request.logprobs ? c.completion_logprobs(0, top) : ojson(nullptr);
      }
      choice["finish_reason"] = c.finish_reason();
      if (call.request.return_token_ids) {
        choice["token_ids"] = c.tokens();
        choice["weight_versions"] = c.weight_versions();
      }
      out["choices"].push_back(std::move(choice));
    }
    out["usage"] = usage(call, choices);
    if (call.request.return_token_ids) out["prompt_token_ids"] = call.prompt_ids;
    out["weight_version"] = call.job->weight_version();
    send_json(res, 200, out);
  }

  // Server-sent events: a chunk per batch of new tokens, then (stream_options.include_usage) a
  // usage chunk and "data: [DONE]". A failed write (the client left) cancels the job: its
  // samples leave the engine's batch at the next step.
  void stream(Call call, httplib::Response& res) {
    struct State {
      Call call;
      std::vector<ChoiceState> choices;
      std::vector<size_t> sent_tokens;
      bool first = true;
      bool closed = false;
    };
    auto st = std::make_shared<State>();
    st->choices = choices_of(call);
    st->sent_tokens.assign(st->choices.size(), 0);
    st->call = std::move(call);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) {
          auto& call = st->call;
          std::vector<TokenEvent> events;
          const bool more = call.job->take(events, std::chrono::milliseconds(200));
          if (more && options.stream_interval_ms > 0 && !call.job->done()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(options.stream_interval_ms));
            call.job->take(events, std::chrono::milliseconds(0));
          }
          feed(call, st->choices, events);
          std::string out;
          auto emit = [&](const ojson& j) { out += "data: " + dump(j) + "\n\n"; };
          if (!call.job->error().empty()) {
            emit(ojson(error_body(500, "server_error", "", call.job->error())));
          } else {
            for (size_t i = 0; i < st->choices.size(); ++i) {
              auto& c = st->choices[i];
              const size_t from = st->sent_tokens[i];
              auto delta_text = c.take_delta();
              const bool ended = c.finished() && !c.end_sent();
              if (delta_text.empty() && !ended && c.role_sent() && c.tokens().size() == from) continue;
              auto chunk = header(call, call.chat ? "chat.completion.chunk" : "text_completion");
              if (st->first && call.request.return_token_ids) chunk["prompt_token_ids"] = call.prompt_ids;
              ojson choice{{"index", i}};
              if (call.chat) {
                ojson delta = ojson::object();
                if (!c.role_sent()) delta["role"] = "assistant";
                if (!delta_text.empty()) delta["content"] = delta_text;
                if (ended && !c.tool_calls().empty()) delta["tool_calls"] = c.tool_calls_json(true);
                choice["delta"] = delta;
                choice["logprobs"] = call.request.logprobs ? c.chat_logprobs(from) : ojson(nullptr);
              } else {
                choice["text"] = delta_text;
                const bool top = call.request.top_logprobs > 0;
                choice["logprobs"] = call.request.logprobs ? c.completion_logprobs(from, top) : ojson(nullptr);
              }
              choice["finish_reason"] = ended ? ojson(c.finish_reason()) : ojson(nullptr);
              if (call.request.return_token_ids) {
                const auto at = static_cast<std::ptrdiff_t>(from);
                choice["token_ids"] = std::vector<int64_t>(c.tokens().begin() + at, c.tokens().end());
                choice["weight_versions"] =
                    std::vector<int64_t>(c.weight_versions().begin() + at, c.weight_versions().end());
              }
              st->sent_tokens[i] = c.tokens().size();
              if (ended) c.mark_end_sent();
              c.mark_role_sent();
              chunk["choices"] = ojson::array({choice});
              emit(chunk);
              st->first = false;
            }
          }
          const bool over = !more || !call.job->error().empty();
          if (over) {
            if (call.request.include_usage && call.job->error().empty()) {
              auto chunk = header(call, call.chat ? "chat.completion.chunk" : "text_completion");
              chunk["choices"] = ojson::array();
              chunk["usage"] = usage(call, st->choices);
              emit(chunk);
            }
            out += "data: [DONE]\n\n";
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            call.job->cancel();
            return false;
          }
          if (over) {
            sink.done();
            st->closed = true;
          }
          return true;
        },
        [st](bool) {
          if (!st->closed) st->call.job->cancel();
        });
  }

  void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    try {
      auto call = chat ? prepare_chat(req) : prepare_completion(req);
      if (call.request.stream) {
        stream(std::move(call), res);
      } else {
        respond(call, res);
      }
    } catch (const ApiError& e) {
      send_error(res, e, options.retry_after_s);
    } catch (const ValueError& e) {
      send_error(res, bad_request("", e.what()));
    }
  }

  // POST /v1/weights/update {"model_path": folder or .safetensors file, "mode": "drain" | "partial"}:
  // the tensors are read and checked against the model's parameters (every one present with its
  // shape) before any is copied, so a bad file changes nothing.
  void update_weights(const httplib::Request& req, httplib::Response& res) {
    try {
      if (!options.enable_weight_update) {
        throw ApiError(403, "permission_error", "",
                       "weight updates are disabled on this server (hyflow-serve --enable-weight-update)");
      }
      const auto body = parse_body(req);
      if (!body.contains("model_path") || !body["model_path"].is_string()) {
        throw bad_request("model_path", "model_path (a model folder or a .safetensors file) is required");
      }
      const std::filesystem::path path = body["model_path"].get<std::string>();
      auto mode = options.weight_update_mode;
      if (body.contains("mode")) {
        if (!body["mode"].is_string()) throw bad_request("mode", "mode must be \"drain\" or \"partial\"");
        try {
          mode = weight_update_mode_named(body["mode"].get<std::string>());
        } catch (const ValueError& e) {
          throw bad_request("mode", e.what());
        }
      }
      std::error_code ec;
      const bool folder = std::filesystem::is_directory(path, ec);
      if (!folder && !(std::filesystem::is_regular_file(path, ec) && path.extension() == ".safetensors")) {
        throw bad_request("model_path", "model_path '" + path.string() +
                                            "' is neither a model folder nor a .safetensors file on the server");
      }
      models::NamedTensors tensors;
      try {
        tensors = folder ? models::load_checkpoint_tensors(path) : models::read_safetensors(path);
      } catch (const Error& e) {
        throw bad_request("model_path", "cannot read model_path '" + path.string() + "': " + e.what());
      }
      int64_t version = 0;
      try {
        version = loop.update_weights(
            [&](models::CausalLM& model) {
              std::map<std::string, const at::Tensor*> by_name;
              for (const auto& [name, t] : tensors) by_name[name] = &t;
              for (const auto& item : model->named_parameters(true)) {
                const auto it = by_name.find(item.key());
                if (it == by_name.end() || it->second->sizes() != item.value().sizes()) {
                  throw FormatError("tensor '" + item.key() + "' is " +
                                    (it == by_name.end() ? "missing" : "not of the model's shape"));
                }
              }
              models::load_parameters(*model, tensors, path.string());
            },
            mode);
      } catch (const FormatError& e) {
        throw bad_request("model_path", "model_path '" + path.string() +
                                            "' does not fit the served model: " + e.what() + " (nothing was loaded)");
      } catch (const Error& e) {
        throw ApiError(503, "server_error", "", e.what());
      }
      send_json(res, 200,
                ojson{{"success", true},
                      {"message", "loaded " + path.string()},
                      {"weight_version", version},
                      {"mode", weight_update_mode_name(mode)}});
    } catch (const ApiError& e) {
      send_error(res, e, options.retry_after_s);
    }
  }

  bool authorized(const httplib::Request& req) const {
    if (options.token.empty()) return true;
    const auto value = req.get_header_value("Authorization");
    return value.rfind("Bearer ", 0) == 0 && metrics::equal_in_constant_time(value.substr(7), options.token);
  }

  void routes() {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("WWW-Authenticate", "Bearer");
      send_json(res, 401,
                ojson(error_body(401, "authentication_error", "", "a valid bearer token is required (Authorization)")));
      return httplib::Server::HandlerResponse::Handled;
    });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, true); });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, false); });
    for (const char* route : {"/v1/weights/update", "/update_weights_from_disk"}) {
      http.Post(route, [this](const httplib::Request& req, httplib::Response& res) { update_weights(req, res); });
    }
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      ojson model{{"id", options.served_model_name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "hyflow"},
                  {"max_model_len", loop.options().max_positions}};
      send_json(res, 200, ojson{{"object", "list"}, {"data", ojson::array({model})}});
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (loop.updating_weights()) {
        send_error(res, ApiError(503, "server_error", "", "the weights are being updated"), options.retry_after_s);
        return;
      }
      const auto st = loop.stats();
      send_json(res, 200,
                ojson{{"status", "ok"},
                      {"weight_version", loop.weight_version()},
                      {"engine",
                       {{"runs", st.runs},
                        {"admitted", st.admitted},
                        {"joined_mid_run", st.joined_mid_run},
                        {"cancelled", st.cancelled},
                        {"tokens", st.tokens},
                        {"peak_running", st.peak_running}}}});
    });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const char* type = res.status == 404 ? "not_found_error" : "invalid_request_error";
      std::string message = res.status == 404   ? "no route " + req.method + " " + req.path
                            : res.status == 413 ? "the request body is too large"
                                                : "the request was refused (HTTP " + std::to_string(res.status) + ")";
      res.set_content(dump(ojson(error_body(res.status, type, "", message))), "application/json");
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string message = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
      }
      send_json(res, 500, ojson(error_body(500, "server_error", "", message)));
    });
  }
};

Server::Server(EngineLoop& loop, std::shared_ptr<const tokenizers::Tokenizer> tokenizer, ServeOptions options)
    : impl_(std::make_unique<Impl>(loop, std::move(tokenizer), std::move(options))) {
  auto& im = *impl_;
  if (im.options.token.empty() && !metrics::is_loopback(im.options.host)) {
    throw ValueError("serve: binding " + im.options.host +
                     " (not a loopback address) requires a bearer token (hyflow-serve --api-key-file)");
  }
  if (im.options.port < 0 || im.options.port > 65535) {
    throw ValueError("serve: port must be in [0, 65535], got " + std::to_string(im.options.port));
  }
  detail::configure_front(
      im.http, static_cast<size_t>(im.options.threads > 0 ? im.options.threads : loop.options().max_in_flight + 8),
      im.options.max_body_bytes);
  im.routes();
  im.port = detail::bind_front(im.http, im.options.host, im.options.port, "serve");
  im.thread = std::thread([&im] { im.http.listen_after_bind(); });
}

Server::~Server() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int Server::port() const {
  return impl_->port;
}

std::string Server::base_url() const {
  return detail::base_url_of(impl_->options.host, impl_->port);
}

SessionStore& Server::sessions() {
  return impl_->sessions;
}

std::optional<DataProto> Server::collect_session(const std::string& session_id) {
  auto session = impl_->sessions.take(session_id);
  if (!session) return std::nullopt;
  return session_to_data_proto(*session, impl_->tokenizer->pad_token_id());
}

}  // namespace hyflow::serve
