// GET /metrics over HTTP on 127.0.0.1: status codes, the bearer token, and the bounds (head
// size, per-connection deadline, concurrent connections) that keep one client from hurting
// another.
#include "http_get.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/metrics/all.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

using namespace hyflow::metrics;
using namespace metrics_test;
using namespace std::chrono_literals;

namespace {

Registry& sample_registry() {
  static Registry r;
  static const bool filled = [] {
    r.counter("hyflow_test_requests_total", "requests", {{"kind", "a\"b"}}).inc(3);
    r.gauge("hyflow_test_level", "level").set(0.25);
    return true;
  }();
  (void)filled;
  return r;
}

}  // namespace

TEST_CASE("GET /metrics answers 200 with the exposition and its content type; port 0 picks a port") {
  Server server(sample_registry(), {});
  REQUIRE(server.port() > 0);
  CHECK(server.address() == "127.0.0.1:" + std::to_string(server.port()));
  const std::string response = get(server.port());
  CHECK(status_of(response) == 200);
  CHECK(response.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n") != std::string::npos);
  CHECK(response.find("Connection: close\r\n") != std::string::npos);
  CHECK(body_of(response) == sample_registry().expose());
  CHECK(status_of(get(server.port(), "/metrics?x=1")) == 200);
}

TEST_CASE("other paths are 404, other methods 405, garbage 400, and the server lives on") {
  Server server(sample_registry(), {});
  CHECK(status_of(get(server.port(), "/")) == 404);
  CHECK(status_of(get(server.port(), "/metricsx")) == 404);
  const std::string post = exchange(server.port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  CHECK(status_of(post) == 405);
  CHECK(post.find("Allow: GET\r\n") != std::string::npos);
  CHECK(status_of(exchange(server.port(), "HEAD /metrics HTTP/1.1\r\n\r\n")) == 405);
  CHECK(status_of(exchange(server.port(), "\r\n\r\n")) == 400);
  CHECK(status_of(exchange(server.port(), "GET /metrics SMTP/2\r\n\r\n")) == 400);
  CHECK(status_of(exchange(server.port(), "GET /metrics HTTP/1.1 extra\r\n\r\n")) == 400);
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    std::string junk(1 + rng() % 600, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    exchange(server.port(), junk + "\r\n\r\n");  // any answer, or none; never a crash
  }
  CHECK(status_of(get(server.port())) == 200);
}

TEST_CASE("with a token every request needs Authorization: Bearer <token>") {
  ServerOptions o;
  o.token = "s3cret-token";
  Server server(sample_registry(), o);
  const std::string none = get(server.port());
  CHECK(status_of(none) == 401);
  CHECK(none.find("WWW-Authenticate: Bearer") != std::string::npos);
  CHECK(body_of(none).find("hyflow_test_level") == std::string::npos);
  CHECK(status_of(get(server.port(), "/metrics", "Authorization: Bearer wrong\r\n")) == 401);
  CHECK(status_of(get(server.port(), "/metrics", "Authorization: Bearer s3cret-tokenX\r\n")) == 401);
  CHECK(status_of(get(server.port(), "/metrics", "Authorization: Basic s3cret-token\r\n")) == 401);
  CHECK(status_of(get(server.port(), "/metrics",
                      "Authorization: Bearer s3cret-token\r\nAuthorization: Bearer other\r\n")) == 401);
  CHECK(status_of(get(server.port(), "/other")) == 401);  // nothing, not even a 404, without the token
  CHECK(status_of(get(server.port(), "/metrics", "Authorization: Bearer s3cret-token\r\n")) == 200);
  CHECK(status_of(get(server.port(), "/metrics", "authorization: bearer s3cret-token\r\n")) == 200);
}

TEST_CASE("a non-loopback bind needs a token; with one it starts") {
  CHECK(is_loopback("127.0.0.1"));
  CHECK(is_loopback("127.1.2.3"));
  CHECK(is_loopback("::1"));
  CHECK(is_loopback("localhost"));
  CHECK_FALSE(is_loopback("0.0.0.0"));
  CHECK_FALSE(is_loopback("::"));
  ServerOptions o;
  o.bind = "0.0.0.0";
  CHECK_THROWS_WITH(Server(sample_registry(), o), Catch::Contains("requires a token"));
  CHECK_THROWS_AS(Server(sample_registry(), o), hyflow::ValueError);
  o.token = "t";
  Server server(sample_registry(), o);
  CHECK(status_of(get(server.port(), "/metrics", "Authorization: Bearer t\r\n")) == 200);
  CHECK(status_of(get(server.port())) == 401);
}

TEST_CASE("bad options are typed errors") {
  ServerOptions o;
  o.port = 70000;
  CHECK_THROWS_AS(Server(sample_registry(), o), hyflow::ValueError);
  o.port = 0;
  o.bind = "no-such-host.invalid";
  CHECK_THROWS_AS(Server(sample_registry(), o), hyflow::Error);
  const std::string path = "/tmp/hyflow_metrics_token_" + std::to_string(::getpid());
  { std::ofstream(path) << "  \n"; }
  CHECK_THROWS_WITH(read_token_file(path), Catch::Contains("is empty"));
  { std::ofstream(path) << "abc123\n"; }
  CHECK(read_token_file(path) == "abc123");
  std::remove(path.c_str());
  CHECK_THROWS_AS(read_token_file(path), hyflow::ValueError);
  CHECK(equal_in_constant_time("abc", "abc"));
  CHECK_FALSE(equal_in_constant_time("abc", "abd"));
  CHECK_FALSE(equal_in_constant_time("abc", "abcd"));
  CHECK_FALSE(equal_in_constant_time("", "a"));
}

TEST_CASE("an oversized head gets 431 and a slow client is cut off, while a scrape succeeds") {
  ServerOptions o;
  o.connection_deadline = 1500ms;
  Server server(sample_registry(), o);
  // a slow client: half a request line, then silence
  int slow = connect_local(server.port());
  (void)!::send(slow, "GET /met", 8, MSG_NOSIGNAL);
  // an oversized head: 9 KiB of headers without the blank line that ends them
  std::string big = "GET /metrics HTTP/1.1\r\n";
  while (big.size() < 9 * 1024) big += "X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(status_of(exchange(server.port(), big)) == 431);
  CHECK(status_of(get(server.port())) == 200);            // served while the slow one waits
  CHECK(std::chrono::steady_clock::now() - t0 < 1000ms);  // before the slow one's deadline
  // the slow client is closed at its deadline, without an answer
  CHECK(read_until_close(slow, 5s).empty());
  CHECK(std::chrono::steady_clock::now() - t0 < 4s);
  ::close(slow);
  CHECK(status_of(get(server.port())) == 200);
}

TEST_CASE("beyond max_connections a client gets 503; the slots free up at the deadline") {
  ServerOptions o;
  o.connection_deadline = 500ms;
  o.max_connections = 2;
  Server server(sample_registry(), o);
  int a = connect_local(server.port());
  int b = connect_local(server.port());
  std::this_thread::sleep_for(100ms);  // both accepted and waiting for their heads
  CHECK(status_of(get(server.port())) == 503);
  read_until_close(a, 3s);
  read_until_close(b, 3s);
  ::close(a);
  ::close(b);
  std::this_thread::sleep_for(50ms);  // their threads release the slots after closing
  CHECK(status_of(get(server.port())) == 200);
}

TEST_CASE("a failing collector gives 500 naming the cause; the server goes on") {
  Registry r;
  r.add_collector([](CollectorSink& out) { out.gauge("bad/name", "b", {}, 1); });
  Server server(r, {});
  const std::string response = get(server.port());
  CHECK(status_of(response) == 500);
  CHECK(body_of(response).find("'bad/name'") != std::string::npos);
}

TEST_CASE("the destructor returns while a client still holds a connection") {
  ServerOptions o;
  o.connection_deadline = 10s;
  auto server = std::make_unique<Server>(sample_registry(), o);
  int idle = connect_local(server->port());
  std::this_thread::sleep_for(50ms);
  const auto t0 = std::chrono::steady_clock::now();
  server.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);  // stop is seen within one 100 ms poll slice
  ::close(idle);
}
