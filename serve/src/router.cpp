// serve::Router: cpp-httplib server in front, one cpp-httplib client per forwarded request
// behind. Streaming requests run their upstream call on a thread of their own that hands the
// chunks to the client's connection through a bounded queue.
#include <hyflow/serve/router.hpp>

#include "http_front.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/metrics/server.hpp>
#include <hyflow/serve/api_error.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace hyflow::serve {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxQueuedBytes = size_t{8} << 20;  // a stream's chunks not yet written to its client
constexpr int kHealthTimeoutS = 5;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e, int retry_after_s) {
  if (e.status() == 503 || e.status() == 429) res.set_header("Retry-After", std::to_string(std::max(1, retry_after_s)));
  send_json(res, e.status(), error_body(e));
}

// "http://host:port" of a base URL "http://host:port[/v1][/]".
std::string origin_of(const std::string& url) {
  const std::string scheme = "http://";
  std::string rest = url;
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.size() >= 3 && rest.compare(rest.size() - 3, 3, "/v1") == 0) rest.resize(rest.size() - 3);
  if (rest.rfind(scheme, 0) != 0 || rest.size() == scheme.size() || rest.find('/', scheme.size()) != std::string::npos)
    throw ValueError("router: replica URL '" + url + "' must be http://host:port or http://host:port/v1");
  return rest;
}

ApiError unreachable(const std::string& url, const std::string& why) {
  return ApiError(503, "server_error", "", "replica " + url + " is unavailable: " + why);
}

// The upstream half of one streamed request: the replica's status and headers, then its body
// chunk by chunk. The producer (upstream thread) waits while kMaxQueuedBytes are queued.
struct Relay {
  std::mutex mu;
  std::condition_variable cv;
  bool headers = false;
  bool done = false;
  bool cancelled = false;
  int status = 0;
  std::string content_type, retry_after, error;
  std::deque<std::string> chunks;
  size_t queued = 0;
  std::thread thread;

  void cancel() {
    {
      std::lock_guard lk(mu);
      cancelled = true;
    }
    cv.notify_all();
  }
  void join() {
    if (thread.joinable()) thread.join();
  }
};

}  // namespace

struct Router::Impl {
  struct Replica {
    std::string url, origin;
    std::atomic<int64_t> in_flight{0}, requests{0}, failures{0};
  };

  RouterOptions options;
  std::vector<std::unique_ptr<Replica>> replicas;
  std::atomic<int64_t> in_flight{0};
  std::atomic<size_t> next_tie{0};
  mutable std::mutex sessions_mu;
  std::list<std::pair<std::string, size_t>> lru;  // most recently used first
  std::unordered_map<std::string, std::list<std::pair<std::string, size_t>>::iterator> sessions;
  httplib::Server http;
  std::thread thread;
  int port = 0;

  std::unique_ptr<httplib::Client> client(const Replica& r, int read_timeout_s) const {
    auto c = std::make_unique<httplib::Client>(r.origin);
    c->set_connection_timeout(options.connect_timeout_s);
    c->set_read_timeout(read_timeout_s);
    c->set_write_timeout(options.connect_timeout_s);
    c->set_keep_alive(false);
    return c;
  }

  httplib::Headers upstream_headers(const httplib::Request& req) const {
    httplib::Headers h;
    if (!options.replica_token.empty()) h.emplace("Authorization", "Bearer " + options.replica_token);
    if (req.has_header("X-Session-Id")) h.emplace("X-Session-Id", req.get_header_value("X-Session-Id"));
    return h;
  }

  // The fewest requests in flight; ties go round in turn (so sequential requests spread too).
  size_t least_loaded() {
    const size_t n = replicas.size(), start = next_tie++ % n;
    size_t best = start;
    for (size_t k = 1; k < n; ++k) {
      const size_t i = (start + k) % n;
      if (replicas[i]->in_flight.load() < replicas[best]->in_flight.load()) best = i;
    }
    return best;
  }

  // The session's replica (pinned on first use), else the least loaded one.
  size_t pick(const std::string& session) {
    if (session.empty()) return least_loaded();
    std::lock_guard lk(sessions_mu);
    if (auto it = sessions.find(session); it != sessions.end()) {
      lru.splice(lru.begin(), lru, it->second);
      return it->second->second;
    }
    const size_t chosen = least_loaded();
    lru.emplace_front(session, chosen);
    sessions[session] = lru.begin();
    while (sessions.size() > options.max_sessions) {
      sessions.erase(lru.back().first);
      lru.pop_back();
    }
    return chosen;
  }

  std::string session_of(const httplib::Request& req, const json& body) const {
    std::string id;
    const char* param = "X-Session-Id";
    if (req.has_header("X-Session-Id")) {
      id = req.get_header_value("X-Session-Id");
    } else if (body.is_object() && body.contains("user") && body.at("user").is_string()) {
      id = body.at("user").get<std::string>();
      param = "user";
    }
    if (id.size() > options.max_session_id_bytes)
      throw bad_request(param, "the session id has " + std::to_string(id.size()) + " bytes, at most " +
                                   std::to_string(options.max_session_id_bytes) + " are allowed");
    return id;
  }

  // Counts a request against the router's and the replica's in-flight figures until destroyed.
  struct InFlight {
    Impl* impl;
    Replica* replica = nullptr;
    explicit InFlight(Impl* i) : impl(i) {
      if (impl->in_flight.fetch_add(1) >= impl->options.max_in_flight) {
        --impl->in_flight;
        impl = nullptr;
        throw ApiError(429, "rate_limit_exceeded", "",
                       "too many requests in flight at the router (" + std::to_string(i->options.max_in_flight) +
                           "); retry later");
      }
    }
    void to(Replica& r) {
      replica = &r;
      ++r.in_flight;
      ++r.requests;
    }
    ~InFlight() {
      if (replica) --replica->in_flight;
      if (impl) --impl->in_flight;
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
  };

  void forward(const httplib::Request& req, httplib::Response& res) {
    auto slot = std::make_shared<InFlight>(this);
    const json body = json::parse(req.body, nullptr, false);  // the replica answers a bad body itself
    Replica& replica = *replicas[pick(session_of(req, body))];
    slot->to(replica);
    const bool stream = body.is_object() && body.value("stream", json(false)) == json(true);
    if (stream) return forward_stream(req, res, replica, std::move(slot));
    auto c = client(replica, options.read_timeout_s);
    auto result = c->Post(req.path, upstream_headers(req), req.body, "application/json");
    if (!result) {
      ++replica.failures;
      throw unreachable(replica.url, httplib::to_string(result.error()));
    }
    copy_answer(*result, res);
  }

  static void copy_answer(const httplib::Response& up, httplib::Response& res) {
    res.status = up.status;
    if (up.has_header("Retry-After")) res.set_header("Retry-After", up.get_header_value("Retry-After"));
    if (up.has_header("WWW-Authenticate")) res.set_header("WWW-Authenticate", up.get_header_value("WWW-Authenticate"));
    const auto type = up.get_header_value("Content-Type");
    res.set_content(up.body, type.empty() ? "application/json" : type);
  }

  void forward_stream(const httplib::Request& req, httplib::Response& res, Replica& replica,
                      std::shared_ptr<InFlight> slot) {
    auto relay = std::make_shared<Relay>();
    httplib::Request up;
    up.method = "POST";
    up.path = req.path;
    up.headers = upstream_headers(req);
    up.set_header("Content-Type", "application/json");
    up.body = req.body;
    up.response_handler = [relay](const httplib::Response& r) {
      std::lock_guard lk(relay->mu);
      relay->headers = true;
      relay->status = r.status;
      relay->content_type = r.get_header_value("Content-Type");
      relay->retry_after = r.get_header_value("Retry-After");
      relay->cv.notify_all();
      return !relay->cancelled;
    };
    up.content_receiver = [relay](const char* data, size_t size, uint64_t, uint64_t) {
      std::unique_lock lk(relay->mu);
      relay->cv.wait(lk, [&] { return relay->cancelled || relay->queued < kMaxQueuedBytes; });
      if (relay->cancelled) return false;
      relay->chunks.emplace_back(data, size);
      relay->queued += size;
      relay->cv.notify_all();
      return true;
    };
    auto c = client(replica, options.read_timeout_s);
    relay->thread = std::thread([relay, c = std::move(c), up = std::move(up), &replica]() mutable {
      auto result = c->send(up);
      std::lock_guard lk(relay->mu);
      if (!result && !relay->cancelled) {
        ++replica.failures;
        relay->error = httplib::to_string(result.error());
      }
      relay->done = true;
      relay->cv.notify_all();
    });
    {
      std::unique_lock lk(relay->mu);
      relay->cv.wait(lk, [&] { return relay->headers || relay->done; });
      if (!relay->headers || relay->content_type.rfind("text/event-stream", 0) != 0) {
        // no stream: an error object (or nothing) comes back whole
        relay->cv.wait(lk, [&] { return relay->done; });
        lk.unlock();
        relay->join();
        if (!relay->headers) throw unreachable(replica.url, relay->error);
        std::string all;
        for (auto& c : relay->chunks) all += c;
        res.status = relay->status;
        if (!relay->retry_after.empty()) res.set_header("Retry-After", relay->retry_after);
        res.set_content(all, relay->content_type.empty() ? "application/json" : relay->content_type);
        return;
      }
    }
    res.status = relay->status;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [relay, url = replica.url](size_t, httplib::DataSink& sink) {
          std::string out;
          bool over = false;
          {
            std::unique_lock lk(relay->mu);
            relay->cv.wait_for(lk, std::chrono::milliseconds(200),
                               [&] { return relay->done || !relay->chunks.empty(); });
            for (auto& c : relay->chunks) out += c;
            relay->chunks.clear();
            relay->queued = 0;
            over = relay->done;
            if (over && !relay->error.empty()) {
              out += "data: " +
                     error_body(503, "server_error", "", "replica " + url + " broke off: " + relay->error)
                         .dump(-1, ' ', false, json::error_handler_t::replace) +
                     "\n\n";
            }
          }
          relay->cv.notify_all();
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            relay->cancel();
            return false;
          }
          if (over) sink.done();
          return true;
        },
        [relay, slot](bool) {
          relay->cancel();
          relay->join();
        });
  }

  // GET `path` from every replica: (status or 0, body or the transport error) in replica order.
  std::vector<std::pair<int, std::string>> ask_all(const std::string& path) const {
    std::vector<std::pair<int, std::string>> out(replicas.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < replicas.size(); ++i) {
      threads.emplace_back([this, i, &path, &out] {
        auto c = client(*replicas[i], kHealthTimeoutS);
        httplib::Headers h;
        if (!options.replica_token.empty()) h.emplace("Authorization", "Bearer " + options.replica_token);
        auto r = c->Get(path.c_str(), h);
        out[i] = r ? std::make_pair(r->status, r->body) : std::make_pair(0, httplib::to_string(r.error()));
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  void health(httplib::Response& res) const {
    const auto answers = ask_all("/health");
    json list = json::array();
    std::vector<std::string> down;
    for (size_t i = 0; i < answers.size(); ++i) {
      const auto& [status, body] = answers[i];
      json entry{{"url", replicas[i]->url}, {"http_status", status}, {"in_flight", replicas[i]->in_flight.load()}};
      auto parsed = json::parse(body, nullptr, false);
      if (status == 0)
        entry["error"] = body;
      else if (!parsed.is_discarded())
        entry["health"] = parsed;
      if (status != 200) down.push_back(replicas[i]->url);
      list.push_back(std::move(entry));
    }
    json out{{"status", down.empty() ? "ok" : "unavailable"}, {"replicas", list}};
    if (!down.empty()) {
      std::string names;
      for (const auto& d : down) names += (names.empty() ? "" : ", ") + d;
      out["error"] = error_body(503, "server_error", "", "replica(s) not healthy: " + names).at("error");
      res.set_header("Retry-After", std::to_string(std::max(1, options.retry_after_s)));
    }
    send_json(res, down.empty() ? 200 : 503, out);
  }

  void models(httplib::Response& res) const {
    const auto answers = ask_all("/v1/models");
    json data = json::array();
    for (size_t i = 0; i < answers.size(); ++i) {
      const auto& [status, body] = answers[i];
      if (status != 200) {
        throw unreachable(replicas[i]->url, status == 0 ? body : "GET /v1/models answered " + std::to_string(status));
      }
      auto parsed = json::parse(body, nullptr, false);
      if (parsed.is_discarded() || !parsed.contains("data") || !parsed.at("data").is_array())
        throw unreachable(replicas[i]->url, "GET /v1/models answered no model list");
      for (const auto& m : parsed.at("data")) {
        const bool seen = std::any_of(data.begin(), data.end(),
                                      [&](const json& d) { return d.value("id", "") == m.value("id", ""); });
        if (!seen) data.push_back(m);
      }
    }
    send_json(res, 200, json{{"object", "list"}, {"data", data}});
  }

  bool authorized(const httplib::Request& req) const {
    if (options.token.empty()) return true;
    const auto value = req.get_header_value("Authorization");
    return value.rfind("Bearer ", 0) == 0 && metrics::equal_in_constant_time(value.substr(7), options.token);
  }

  template <class Fn>
  void guarded(httplib::Response& res, Fn&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      send_error(res, e, options.retry_after_s);
    }
  }

  void routes() {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("WWW-Authenticate", "Bearer");
      send_json(res, 401,
                error_body(401, "authentication_error", "", "a valid bearer token is required (Authorization)"));
      return httplib::Server::HandlerResponse::Handled;
    });
    for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
      http.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] { forward(req, res); });
      });
    }
    http.Get("/v1/models",
             [this](const httplib::Request&, httplib::Response& res) { guarded(res, [&] { models(res); }); });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const char* type = res.status == 404 ? "not_found_error" : "invalid_request_error";
      std::string message = res.status == 404   ? "no route " + req.method + " " + req.path
                            : res.status == 413 ? "the request body is too large"
                                                : "the request was refused (HTTP " + std::to_string(res.status) + ")";
      send_json(res, res.status, error_body(res.status, type, "", message));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string message = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
      }
      send_json(res, 500, error_body(500, "server_error", "", message));
    });
  }
};

Router::Router(RouterOptions options) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.options = std::move(options);
  const auto& o = im.options;
  if (o.replicas.empty()) throw ValueError("router: no replica URLs given");
  if (o.token.empty() && !metrics::is_loopback(o.host))
    throw ValueError("router: binding " + o.host + " (not a loopback address) requires a bearer token");
  if (o.port < 0 || o.port > 65535)
    throw ValueError("router: port must be in [0, 65535], got " + std::to_string(o.port));
  if (o.max_in_flight <= 0) throw ValueError("router: max_in_flight must be > 0");
  if (o.max_sessions == 0) throw ValueError("router: max_sessions must be > 0");
  for (const auto& url : o.replicas) {
    auto r = std::make_unique<Impl::Replica>();
    r->url = url;
    r->origin = origin_of(url);
    im.replicas.push_back(std::move(r));
  }
  detail::configure_front(im.http, static_cast<size_t>(o.threads > 0 ? o.threads : o.max_in_flight + 8),
                          o.max_body_bytes);
  im.routes();
  im.port = detail::bind_front(im.http, o.host, o.port, "router");
  im.thread = std::thread([&im] { im.http.listen_after_bind(); });
}

Router::~Router() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int Router::port() const {
  return impl_->port;
}

std::string Router::base_url() const {
  return detail::base_url_of(impl_->options.host, impl_->port);
}

std::vector<ReplicaStats> Router::replicas() const {
  std::vector<ReplicaStats> out;
  for (const auto& r : impl_->replicas)
    out.push_back(ReplicaStats{r->url, r->in_flight.load(), r->requests.load(), r->failures.load()});
  return out;
}

std::optional<size_t> Router::session_replica(const std::string& session_id) const {
  std::lock_guard lk(impl_->sessions_mu);
  auto it = impl_->sessions.find(session_id);
  if (it == impl_->sessions.end()) return std::nullopt;
  return it->second->second;
}

}  // namespace hyflow::serve
