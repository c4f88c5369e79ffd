// serve::Router in front of in-process replicas over loopback HTTP: answers equal the replica's
// own, requests spread over replicas, a session stays on its replica, streams are forwarded
// event by event, /health and /v1/models aggregate, the token and body rules hold, and a replica
// that cannot be reached is a 503 naming it.
#include "serve_fixture.hpp"

#include <hyflow/serve/router.hpp>

#include <httplib.h>
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <future>

using namespace hyflow;
using namespace hyflow::testing;
using json = nlohmann::json;

namespace {

httplib::Client client_of(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30);
  return c;
}

json post(httplib::Client& c, const std::string& path, const json& body, int expect = 200,
          const httplib::Headers& headers = {}) {
  auto res = c.Post(path.c_str(), headers, body.dump(), "application/json");
  REQUIRE(res);
  INFO(res->body);
  REQUIRE(res->status == expect);
  return json::parse(res->body);
}

json completion(const std::vector<int64_t>& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"return_token_ids", true}, {"logprobs", 0}};
}

// A loopback port nobody listens on (bound, then closed).
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

struct Replicas {
  std::vector<std::unique_ptr<ServedTiny>> served;
  explicit Replicas(size_t n) {
    for (size_t i = 0; i < n; ++i) served.push_back(std::make_unique<ServedTiny>());
  }
  std::vector<std::string> urls() const {
    std::vector<std::string> out;
    for (const auto& s : served) out.push_back(s->server->base_url());
    return out;
  }
};

}  // namespace

TEST_CASE("router: answers equal the replica's own, and requests spread over the replicas") {
  Replicas reps(3);
  serve::Router router({.replicas = reps.urls()});
  CHECK(router.base_url() == "http://127.0.0.1:" + std::to_string(router.port()) + "/v1");
  auto direct = client_of(reps.served[0]->server->port());
  auto via = client_of(router.port());
  const auto prompt = reps.served[0]->tokenizer->encode("hello router");
  const auto want = post(direct, "/v1/completions", completion(prompt));
  for (int i = 0; i < 6; ++i) {
    const auto got = post(via, "/v1/completions", completion(prompt));
    CHECK(got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]);
    CHECK(got["choices"][0]["logprobs"] == want["choices"][0]["logprobs"]);
    CHECK(got["prompt_token_ids"] == want["prompt_token_ids"]);
  }
  // every replica got its share (ties of the in-flight count go round in turn)
  for (const auto& r : router.replicas()) {
    CHECK(r.requests == 2);
    CHECK(r.in_flight == 0);
    CHECK(r.failures == 0);
  }
  // a bad body is the replica's 400, passed through
  const auto bad = post(via, "/v1/completions", json{{"prompt", "x"}, {"temperature", -1}}, 400);
  CHECK(bad["error"]["param"] == "temperature");
}

TEST_CASE("router: a session stays on one replica, which records all its turns") {
  Replicas reps(2);
  serve::Router router({.replicas = reps.urls(), .max_sessions = 2});
  auto via = client_of(router.port());
  const auto prompt = reps.served[0]->tokenizer->encode("turn");
  for (int turn = 0; turn < 3; ++turn) {
    post(via, "/v1/completions", completion(prompt), 200, {{"X-Session-Id", "episode-1"}});
    auto body = completion(prompt);
    body["user"] = "episode-2";
    post(via, "/v1/completions", body);
  }
  const auto a = router.session_replica("episode-1"), b = router.session_replica("episode-2");
  REQUIRE(a);
  REQUIRE(b);
  for (const auto& [id, pinned] : {std::pair{std::string("episode-1"), *a}, std::pair{std::string("episode-2"), *b}}) {
    auto rows = reps.served[pinned]->server->collect_session(id);
    REQUIRE(rows);
    CHECK(rows->size() == 3);  // three turns that do not extend each other: a row each
    CHECK_FALSE(reps.served[1 - pinned]->server->collect_session(id));
  }
  // the affinity map is bounded: a third session drops the least recently used one
  post(via, "/v1/completions", completion(prompt), 200, {{"X-Session-Id", "episode-3"}});
  CHECK_FALSE(router.session_replica("episode-1"));
  CHECK(router.session_replica("episode-3"));
  const auto long_id = post(via, "/v1/completions", completion(prompt), 400, {{"X-Session-Id", std::string(200, 's')}});
  CHECK(long_id["error"]["param"] == "X-Session-Id");
}

TEST_CASE("router: streams are forwarded event by event and add up to the whole answer") {
  // one wider (slower) replica, so that a long answer takes many engine steps
  ServedTiny slow({}, {}, 16, 256);
  serve::Router router({.replicas = {slow.server->base_url()}});
  auto direct = client_of(slow.server->port());
  auto via = client_of(router.port());
  auto body = completion(slow.tokenizer->encode("stream me"));
  body["max_tokens"] = 400;
  body["ignore_eos"] = true;
  const auto want = post(direct, "/v1/completions", body);
  const int64_t tokens_before = slow.loop->stats().tokens;
  body["stream"] = true;
  std::vector<int64_t> tokens;
  std::string buffer;
  int events = 0;
  int64_t made_at_first_event = -1;  // tokens the replica had made when the client got the first event
  bool done = false;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (made_at_first_event < 0) made_at_first_event = slow.loop->stats().tokens - tokens_before;
    buffer.append(data, size);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos; buffer.erase(0, end + 2)) {
      const auto event = buffer.substr(0, end);
      REQUIRE(event.rfind("data: ", 0) == 0);
      if (event == "data: [DONE]") {
        done = true;
        continue;
      }
      ++events;
      const auto chunk = json::parse(event.substr(6));
      for (const auto& t : chunk["choices"][0]["token_ids"]) tokens.push_back(t.get<int64_t>());
    }
    return true;
  };
  auto res = via.send(req);
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(done);
  CHECK(events > 1);
  // not gathered at the router: the first event reached the client long before the answer was whole
  CHECK(made_at_first_event < 200);
  CHECK(json(tokens) == want["choices"][0]["token_ids"]);
  // a streamed error (a bad body) comes back whole with its status
  auto bad = via.Post("/v1/completions", json{{"prompt", "x"}, {"stream", true}, {"n", 0}}.dump(), "application/json");
  REQUIRE(bad);
  CHECK(bad->status == 400);
  CHECK(json::parse(bad->body)["error"]["param"] == "n");
}

TEST_CASE("router: /health and /v1/models aggregate; a replica down is a 503 naming it") {
  Replicas reps(2);
  {
    serve::Router router({.replicas = reps.urls()});
    auto via = client_of(router.port());
    auto health = via.Get("/health");
    REQUIRE(health);
    CHECK(health->status == 200);
    const auto h = json::parse(health->body);
    CHECK(h["status"] == "ok");
    REQUIRE(h["replicas"].size() == 2);
    CHECK(h["replicas"][1]["health"]["status"] == "ok");
    auto models = via.Get("/v1/models");
    REQUIRE(models);
    CHECK(models->status == 200);
    const auto m = json::parse(models->body);
    REQUIRE(m["data"].size() == 1);  // both serve "tiny"
    CHECK(m["data"][0]["id"] == "tiny");
  }
  const std::string down = "http://127.0.0.1:" + std::to_string(closed_port()) + "/v1";
  serve::Router router({.replicas = {down}, .connect_timeout_s = 2});
  auto via = client_of(router.port());
  for (bool stream : {false, true}) {
    auto body = completion({10, 11});
    body["stream"] = stream;
    auto res = via.Post("/v1/completions", body.dump(), "application/json");
    REQUIRE(res);
    CHECK(res->status == 503);
    CHECK(res->has_header("Retry-After"));
    const auto e = json::parse(res->body);
    CHECK(e["error"]["type"] == "server_error");
    CHECK_THAT(e["error"]["message"].get<std::string>(), Catch::Contains(down));
  }
  CHECK(router.replicas()[0].failures == 2);
  auto health = via.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 503);
  CHECK_THAT(health->body, Catch::Contains(down));
  auto models = via.Get("/v1/models");
  REQUIRE(models);
  CHECK(models->status == 503);
}

TEST_CASE("router: bearer token, body limit, in-flight limit, bad replica URLs") {
  Replicas reps(1);
  serve::Router router({.replicas = reps.urls(), .token = "s3cret", .max_body_bytes = 4096});
  auto via = client_of(router.port());
  const auto prompt = completion({10, 11, 12});
  const auto no_token = post(via, "/v1/completions", prompt, 401);
  CHECK(no_token["error"]["type"] == "authentication_error");
  post(via, "/v1/completions", prompt, 401, {{"Authorization", "Bearer wrong"}});
  post(via, "/v1/completions", prompt, 200, {{"Authorization", "Bearer s3cret"}});
  auto big =
      via.Post("/v1/completions", {{"Authorization", "Bearer s3cret"}}, std::string(8192, ' '), "application/json");
  REQUIRE(big);
  CHECK(big->status == 413);

  CHECK_THROWS_WITH(serve::Router({.replicas = reps.urls(), .host = "0.0.0.0"}), Catch::Contains("bearer token"));
  CHECK_THROWS_WITH(serve::Router({.replicas = {}}), Catch::Contains("no replica"));
  CHECK_THROWS_WITH(serve::Router({.replicas = {"https://127.0.0.1:1/v1"}}), Catch::Contains("https://127.0.0.1:1/v1"));
  CHECK_THROWS_WITH(serve::Router({.replicas = {"http://127.0.0.1:1/api"}}), Catch::Contains("http://host:port"));

  // one request in flight at a time: a second one meanwhile is a 429 with Retry-After
  ServedTiny slow({}, {}, 16, 256);
  serve::Router one({.replicas = {slow.server->base_url()}, .max_in_flight = 1});
  auto first = std::async(std::launch::async, [&] {
    auto c = client_of(one.port());
    auto body = completion(slow.tokenizer->encode("a long one"));
    body["max_tokens"] = 400;
    body["ignore_eos"] = true;
    return c.Post("/v1/completions", body.dump(), "application/json")->status;
  });
  auto c = client_of(one.port());
  int status = 200;
  for (int i = 0; i < 200 && status != 429; ++i) {
    auto res = c.Get("/health");  // not counted: only completions are
    REQUIRE(res->status == 200);
    auto small = completion({10});
    small["max_tokens"] = 1;
    auto r = c.Post("/v1/completions", small.dump(), "application/json");
    status = r->status;
    if (status == 429) CHECK(r->has_header("Retry-After"));
  }
  CHECK(status == 429);
  CHECK(first.get() == 200);
}
