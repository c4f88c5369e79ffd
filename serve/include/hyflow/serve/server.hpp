#pragma once
// Server: an OpenAI-compatible HTTP front of an EngineLoop (cpp-httplib: chunked responses for
// server-sent events, keep-alive, a bounded thread pool). Endpoints: POST /v1/chat/completions,
// POST /v1/completions, GET /v1/models, GET /health. Token in, token out: `return_token_ids`
// adds the prompt's and each choice's token ids, `logprobs` each token's log-prob, and a
// completion prompt may be token ids. Requests tagged with a session id (X-Session-Id, else
// `user`) are recorded in sessions() turn by turn. Errors are OpenAI error objects: 400 naming
// the field, 401 (bearer token), 404, 413 (body), 429 (in flight), 503 with Retry-After while
// weights are updated (when told to refuse rather than queue). POST /v1/weights/update (and
// SGLang's /update_weights_from_disk) loads weights from a model folder or safetensors file into
// the loop, only when enable_weight_update is set. Guide: docs/rollout-server.md.

#include <hyflow/serve/engine_loop.hpp>
#include <hyflow/serve/openai_request.hpp>
#include <hyflow/serve/session_store.hpp>
#include <hyflow/tokenizers/chat_template.hpp>
#include <hyflow/tokenizers/tokenizer.hpp>

#include <memory>
#include <string>

namespace hyflow::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";  ///< loopback by default; any other address needs `token`
  int port = 0;                    ///< 0: a free port (Server::port)
  std::string token;               ///< bearer token every request must carry (empty: none, loopback only)
  std::string served_model_name = "hyflow";
  size_t max_body_bytes = size_t{1} << 20;  ///< larger bodies: 413
  int threads = 0;                          ///< HTTP threads; 0: the loop's max_in_flight + 8
  RequestLimits limits;
  tokenizers::ChatTemplateOptions chat;  ///< template and default system turn (tools come per request)
  /// Extra stop strings of every chat request (a template end marker that is no single token,
  /// e.g. "<|im_end|>" under a character tokenizer).
  std::vector<std::string> chat_stop;
  /// While a weight update drains the engine: true answers 503 with Retry-After, false queues.
  bool reject_during_weight_update = false;
  /// What a weight update does to running requests when its request names no `mode`: kDrain
  /// lets them finish on the old weights, kPartial (verl's partial rollout) pauses them at the
  /// next step and resumes them on the new weights.
  WeightUpdateMode weight_update_mode = WeightUpdateMode::kDrain;
  /// Serves POST /v1/weights/update: a client may make the server read weight files from its
  /// disk. Off by default (403); the bearer token applies as to every route.
  bool enable_weight_update = false;
  /// Streaming: after a chunk's first token, wait this long for more before writing (vLLM's
  /// stream interval; fewer, larger chunks cost less CPU per token when many clients stream).
  /// 0: a chunk per engine step.
  int stream_interval_ms = 0;
  int retry_after_s = 1;
  SessionStoreOptions sessions;
};

class Server {
 public:
  /// Binds and serves on its own thread. `loop` must outlive the server. ValueError for a
  /// non-loopback host without a token; hyflow::Error when the address cannot be bound.
  Server(EngineLoop& loop, std::shared_ptr<const tokenizers::Tokenizer> tokenizer, ServeOptions options);
  /// Stops accepting, finishes the requests in progress and joins.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  /// "http://host:port/v1", what an OpenAI client takes as base_url.
  std::string base_url() const;
  SessionStore& sessions();
  /// The recorded session as verl's rollout rows (session_to_data_proto), forgotten here; nullopt when unknown.
  std::optional<DataProto> collect_session(const std::string& session_id);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyflow::serve
