// The server end to end, in process, over HTTP on 127.0.0.1 (cpp-httplib's client): greedy
// outputs equal DecodeEngine::run's for the same prompts, alone and with concurrent clients
// sharing the batch; chat shapes, tool rendering, streaming, sessions as DataProto rows; the
// error statuses; a client that leaves mid-stream frees its slot.
#include "serve_fixture.hpp"

#include <hyflow/tokenizers/chat_template.hpp>

#include <httplib.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <latch>
#include <thread>

using namespace hyflow;
using namespace hyflow::testing;
using json = nlohmann::json;

namespace {

httplib::Client client(const ServedTiny& s) {
  httplib::Client c("127.0.0.1", s.server->port());
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

std::vector<std::vector<int64_t>> prompts(const tokenizers::Tokenizer& tok) {
  return {tok.encode("1+2="),
          tok.encode("hello there"),
          tok.encode("a"),
          tok.encode("The quick brown fox jumps"),
          tok.encode("x*y=12;"),
          tok.encode("??"),
          tok.encode("OpenAI compatible"),
          tok.encode("3-1=")};
}

// What the engine alone gives for the prompts in one batch (greedy, max_new_tokens 20, eos 2).
std::vector<std::vector<int64_t>> direct(ServedTiny& s, const std::vector<std::vector<int64_t>>& ps) {
  inference::DecodeEngine engine(s.model, {.max_batch = 16});
  std::vector<inference::DecodeRequest> reqs;
  for (const auto& p : ps) {
    reqs.push_back({.prompt = p, .positions = {}, .n = 1, .max_new_tokens = 20, .first_row_id = 0});
  }
  inference::DecodeSampling sampling;
  sampling.sampling.greedy = true;
  sampling.eos_token_ids = {s.tokenizer->eos_token_id()};
  std::vector<std::vector<int64_t>> out;
  for (auto& o : engine.run(reqs, sampling)) out.push_back(o.tokens);
  return out;
}

json completion(const std::vector<int64_t>& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}, {"return_token_ids", true}, {"logprobs", 0}};
}

}  // namespace

TEST_CASE("greedy completions through the server equal DecodeEngine::run, alone and concurrent") {
  ServedTiny s;
  const auto ps = prompts(*s.tokenizer);
  const auto expected = direct(s, ps);
  auto c = client(s);
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto r = post(c, "/v1/completions", completion(ps[i]));
    CHECK(r["choices"][0]["token_ids"].get<std::vector<int64_t>>() == expected[i]);
    CHECK(r["prompt_token_ids"].get<std::vector<int64_t>>() == ps[i]);
    CHECK(r["choices"][0]["logprobs"]["token_logprobs"].size() == expected[i].size());
    CHECK(r["usage"]["completion_tokens"] == expected[i].size());
  }
  // Eight clients at once, admitted together: a weight update that changes nothing holds the engine
  // thread until all eight are queued, so they share one run whatever the machine's load (left to
  // timing, a loaded machine finished a client's 20 tokens before the next request arrived).
  const auto alone = s.loop->stats();  // (a request may join the end of the run of the one before it)
  std::promise<void> gate;
  const std::shared_future<void> opened = gate.get_future().share();
  const std::function<void(models::CausalLM&)> hold_engine = [opened](models::CausalLM&) { opened.wait(); };
  auto held = std::async(std::launch::async, [&] { return s.loop->update_weights(hold_engine); });
  std::vector<std::future<json>> answers;
  struct OpenOnExit {  // a failed REQUIRE must not leave the engine thread (and ~ServedTiny) waiting
    std::function<void()> open;
    ~OpenOnExit() { open(); }
  } open_on_exit{[&gate, open = false]() mutable {
    if (!open) gate.set_value();
    open = true;
  }};
  const auto within = [](auto&& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return done();
  };
  REQUIRE(within([&] { return s.loop->updating_weights(); }));
  for (size_t i = 0; i < ps.size(); ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      auto own = client(s);
      auto res = own.Post("/v1/completions", completion(ps[i]).dump(), "application/json");
      return res && res->status == 200 ? json::parse(res->body) : json();
    }));
  }
  REQUIRE(within([&] { return s.loop->stats().queued == static_cast<int64_t>(ps.size()); }));
  open_on_exit.open();
  CHECK(held.get() == 1);
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto r = answers[i].get();
    REQUIRE(r.is_object());
    CHECK(r["choices"][0]["token_ids"].get<std::vector<int64_t>>() == expected[i]);
  }
  const auto stats = s.loop->stats();
  CHECK(stats.admitted == static_cast<int64_t>(2 * ps.size()));
  CHECK(stats.runs == alone.runs + 1);  // all eight in one run, admitted together at its first step
  CHECK(stats.joined_mid_run == alone.joined_mid_run);
  CHECK(stats.peak_running == static_cast<int64_t>(ps.size()));
  CHECK(stats.queued == 0);
}

TEST_CASE("chat: the template's prompt ids, OpenAI's shape, tools rendered, n choices, seeds repeat") {
  ServedTiny s;
  auto c = client(s);
  json body{{"model", "tiny"},          {"messages", {{{"role", "user"}, {"content", "What is 2+2?"}}}},
            {"max_tokens", 12},         {"temperature", 0},
            {"return_token_ids", true}, {"logprobs", true}};
  const auto r = post(c, "/v1/chat/completions", body);
  const auto expected_prompt =
      s.tokenizer->encode(tokenizers::apply_chatml({{.role = "user", .content = "What is 2+2?"}}));
  CHECK(r["object"] == "chat.completion");
  CHECK(r["model"] == "tiny");
  CHECK(r["prompt_token_ids"].get<std::vector<int64_t>>() == expected_prompt);
  const auto& choice = r["choices"][0];
  CHECK(choice["message"]["role"] == "assistant");
  CHECK(choice["message"]["content"].is_string());
  CHECK(choice["logprobs"]["content"].size() == choice["token_ids"].size());
  CHECK((choice["finish_reason"] == "stop" || choice["finish_reason"] == "length"));

  json tools =
      json::array({{{"type", "function"}, {"function", {{"name", "add"}, {"parameters", {{"type", "object"}}}}}}});
  body["tools"] = tools;
  const auto with_tools = post(c, "/v1/chat/completions", body);
  const auto rendered = s.tokenizer->decode(with_tools["prompt_token_ids"].get<std::vector<int64_t>>());
  CHECK(rendered.find("<tools>") != std::string::npos);
  CHECK(rendered.find("\"name\": \"add\"") != std::string::npos);
  body["tool_choice"] = "none";
  const auto no_tools = post(c, "/v1/chat/completions", body);
  CHECK(no_tools["prompt_token_ids"] == r["prompt_token_ids"]);

  json sampled{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
               {"n", 3},
               {"max_tokens", 8},
               {"temperature", 1.0},
               {"seed", 42},
               {"return_token_ids", true}};
  const auto a = post(c, "/v1/chat/completions", sampled);
  const auto b = post(c, "/v1/chat/completions", sampled);
  REQUIRE(a["choices"].size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(a["choices"][i]["token_ids"] == b["choices"][i]["token_ids"]);
  CHECK(a["choices"][0]["token_ids"] != a["choices"][1]["token_ids"]);
}

TEST_CASE("streaming: server-sent events whose deltas add up to the non-streamed answer") {
  ServedTiny s;
  auto c = client(s);
  json body{{"messages", {{{"role", "user"}, {"content", "count"}}}},
            {"max_tokens", 16},
            {"temperature", 0},
            {"return_token_ids", true},
            {"stream_options", {{"include_usage", true}}}};
  const auto whole = post(c, "/v1/chat/completions", body);
  body["stream"] = true;
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "text/event-stream");
  std::string content;
  std::vector<int64_t> ids;
  std::string finish;
  bool done = false, usage = false;
  size_t at = 0;
  while ((at = res->body.find("data: ", at)) != std::string::npos) {
    const auto end = res->body.find("\n\n", at);
    const auto data = res->body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    const auto chunk = json::parse(data);
    CHECK(chunk["object"] == "chat.completion.chunk");
    if (chunk.contains("usage")) {
      usage = true;
      continue;
    }
    const auto& ch = chunk["choices"][0];
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    for (auto id : ch["token_ids"]) ids.push_back(id.get<int64_t>());
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  CHECK(done);
  CHECK(usage);
  CHECK(content == whole["choices"][0]["message"]["content"].get<std::string>());
  CHECK(ids == whole["choices"][0]["token_ids"].get<std::vector<int64_t>>());
  CHECK(finish == whole["choices"][0]["finish_reason"].get<std::string>());
}

TEST_CASE("sessions: tagged turns come back as one DataProto row with the model's tokens masked in") {
  ServedTiny s;
  auto c = client(s);
  const auto p1 = s.tokenizer->encode("Q: 1+1? A:");
  const auto r1 =
      post(c, "/v1/completions", {{"prompt", p1}, {"max_tokens", 5}, {"temperature", 0}, {"return_token_ids", true}},
           200, {{"X-Session-Id", "episode-7"}});
  auto p2 = p1;
  const auto out1 = r1["choices"][0]["token_ids"].get<std::vector<int64_t>>();
  p2.insert(p2.end(), out1.begin(), out1.end());
  const auto tool = s.tokenizer->encode(" [tool: 2] ");
  p2.insert(p2.end(), tool.begin(), tool.end());
  const auto r2 = post(c, "/v1/completions",
                       {{"prompt", p2},
                        {"max_tokens", 4},
                        {"temperature", 0},
                        {"return_token_ids", true},
                        {"logprobs", 0},
                        {"user", "episode-7"}});
  const auto out2 = r2["choices"][0]["token_ids"].get<std::vector<int64_t>>();
  auto dp = s.server->collect_session("episode-7");
  REQUIRE(dp);
  REQUIRE(dp->batch.at("prompts").size(0) == 1);
  const auto responses = dp->batch.at("responses")[0];
  const auto mask = dp->batch.at("response_mask")[0];
  const auto n1 = static_cast<int64_t>(out1.size()), nt = static_cast<int64_t>(tool.size());
  CHECK(responses.size(0) == n1 + nt + static_cast<int64_t>(out2.size()));
  CHECK(mask.slice(0, 0, n1).sum().item<int64_t>() == n1);
  CHECK(mask.slice(0, n1, n1 + nt).sum().item<int64_t>() == 0);
  CHECK(mask.slice(0, n1 + nt).sum().item<int64_t>() == static_cast<int64_t>(out2.size()));
  const auto lps = dp->batch.at("rollout_log_probs")[0];
  CHECK(lps[n1 + nt].item<float>() ==
        Approx(r2["choices"][0]["logprobs"]["token_logprobs"][0].get<float>()).margin(1e-6));
  CHECK(dp->non_tensor_batch.at("weight_versions")[0] == Json::array({0, 0}));
  CHECK_FALSE(s.server->collect_session("episode-7"));
}

TEST_CASE("errors are OpenAI error objects with the right status") {
  serve::ServeOptions options;
  options.max_body_bytes = 4096;
  ServedTiny s(options);
  auto c = client(s);
  auto bad = c.Post("/v1/chat/completions", "{not json", "application/json");
  REQUIRE(bad);
  CHECK(bad->status == 400);
  CHECK(json::parse(bad->body)["error"]["type"] == "invalid_request_error");
  const auto field =
      post(c, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"temperature", -1}}, 400);
  CHECK(field["error"]["param"] == "temperature");
  const auto ids = post(c, "/v1/completions", {{"prompt", {1, 100000}}}, 400);
  CHECK(ids["error"]["param"] == "prompt");
  const auto model = post(c, "/v1/completions", {{"prompt", "x"}, {"model", "gpt-9"}}, 404);
  CHECK(model["error"]["param"] == "model");
  auto missing = c.Get("/v1/nothing");
  REQUIRE(missing);
  CHECK(missing->status == 404);
  CHECK(json::parse(missing->body)["error"]["type"] == "not_found_error");
  auto big = c.Post("/v1/completions", std::string(8192, ' '), "application/json");
  REQUIRE(big);
  CHECK(big->status == 413);
  CHECK(json::parse(big->body)["error"]["code"] == 413);
  const auto long_prompt = post(c, "/v1/completions", {{"prompt", std::string(1100, 'a')}}, 400);
  CHECK(long_prompt["error"]["param"] == "prompt");
  auto models = c.Get("/v1/models");
  REQUIRE(models);
  CHECK(json::parse(models->body)["data"][0]["id"] == "tiny");
}

TEST_CASE("a bearer token is required when set; a non-loopback bind without one is refused") {
  serve::ServeOptions options;
  options.token = "s3cret";
  ServedTiny s(options);
  auto c = client(s);
  auto none = c.Get("/health");
  REQUIRE(none);
  CHECK(none->status == 401);
  CHECK(json::parse(none->body)["error"]["type"] == "authentication_error");
  auto wrong = c.Get("/health", {{"Authorization", "Bearer nope"}});
  REQUIRE(wrong);
  CHECK(wrong->status == 401);
  auto right = c.Get("/health", {{"Authorization", "Bearer s3cret"}});
  REQUIRE(right);
  CHECK(right->status == 200);
  serve::ServeOptions open;
  open.host = "0.0.0.0";
  CHECK_THROWS_WITH(ServedTiny(open), Catch::Contains("requires a bearer token"));
}

TEST_CASE("a weight update drains the engine: 503 + Retry-After or a queued wait; 429 past max_in_flight") {
  serve::ServeOptions options;
  options.reject_during_weight_update = true;
  serve::EngineLoopOptions loop_options;
  loop_options.max_in_flight = 1;
  ServedTiny s(options, loop_options);
  auto c = client(s);
  std::promise<void> release;
  auto released = release.get_future().share();
  std::latch entered(1);
  auto update = std::async(std::launch::async, [&] {
    return s.loop->update_weights([&](models::CausalLM& m) {
      entered.count_down();
      released.wait();
      m->named_parameters()["model.norm.weight"].mul_(1.5);
    });
  });
  entered.wait();
  auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 503);
  CHECK(health->get_header_value("Retry-After") == "1");
  const auto refused = post(c, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}}, 503);
  CHECK(refused["error"]["type"] == "server_error");
  release.set_value();
  CHECK(update.get() == 1);
  // One request in flight fills max_in_flight: the next one is 429.
  auto queued = s.loop->submit({.prompt = {5, 6}, .n = 1, .max_tokens = 900, .sampling = {.greedy = true}, .seed = {}});
  const auto busy = post(c, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}}, 429);
  CHECK(busy["error"]["type"] == "rate_limit_exceeded");
  queued->cancel();
  queued->wait_all();
  const auto after = post(c, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {"temperature", 0}});
  CHECK(after["weight_version"] == 1);
}

TEST_CASE("a client that leaves mid-stream frees its slot at the next step") {
  ServedTiny s({}, {}, 16, 256);  // a wider model: 900 steps take far longer than noticing the client left
  httplib::Client c("127.0.0.1", s.server->port());
  // ignore_eos: the stream runs to max_tokens unless the disconnect ends it.
  json body{{"prompt", "abc"}, {"max_tokens", 900}, {"temperature", 0}, {"stream", true}, {"ignore_eos", true}};
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto res = c.send(req);
  CHECK(chunks == 3);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s.loop->stats().cancelled == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(s.loop->stats().cancelled == 1);
  CHECK(s.loop->stats().tokens < 900);
}

namespace {

// A change of the weights that changes greedy choices (not only the logits' scale).
void perturb(models::CausalLM& m) {
  torch::NoGradGuard no_grad;
  auto w = m->named_parameters()["model.layers.0.mlp.up_proj.weight"];
  torch::manual_seed(17);
  w.add_(torch::randn(w.sizes(), w.options()));
}

// The engine alone on the served model's current weights: no end token, what the loop runs.
std::vector<inference::DecodeOutput> engine_run(ServedTiny& s, const inference::DecodeRequest& r,
                                                const inference::DecodeSampling& sampling) {
  inference::DecodeEngine engine(s.model, {.max_batch = 16});
  return engine.run({r}, sampling);
}

}  // namespace

TEST_CASE("a partial weight update mid-stream: full length, old-weight tokens before, new-weight tokens after") {
  ServedTiny s({}, {}, 16, 256);  // a wider model: 400 steps take far longer than the update takes to land
  const auto prompt = s.tokenizer->encode("abc");
  const int64_t total = 400;
  inference::DecodeSampling greedy;
  greedy.sampling.greedy = true;
  const auto old_tokens = engine_run(s, {.prompt = prompt, .n = 1, .max_new_tokens = total}, greedy)[0].tokens;

  httplib::Client c("127.0.0.1", s.server->port());
  c.set_read_timeout(60);
  json body{{"prompt", prompt}, {"max_tokens", total}, {"temperature", 0},
            {"stream", true},   {"ignore_eos", true},  {"return_token_ids", true}};
  std::string sse;
  std::future<int64_t> update;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}, {"X-Session-Id", "partial"}};
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    sse.append(data, size);
    if (!update.valid()) {  // the first chunk arrived: swap the weights under the running stream
      update = std::async(std::launch::async,
                          [&] { return s.loop->update_weights(perturb, serve::WeightUpdateMode::kPartial); });
    }
    return true;
  };
  auto res = c.send(req);
  REQUIRE(res);
  REQUIRE(update.valid());
  CHECK(update.get() == 1);

  std::vector<int64_t> tokens, versions;
  std::string text, finish;
  for (size_t at = 0; (at = sse.find("data: ", at)) != std::string::npos;) {
    const size_t end = sse.find("\n\n", at);
    const auto payload = sse.substr(at + 6, end - at - 6);
    at = end;
    if (payload == "[DONE]") break;
    const auto chunk = json::parse(payload);
    REQUIRE(chunk.contains("choices"));
    const auto& choice = chunk["choices"][0];
    for (auto t : choice["token_ids"]) tokens.push_back(t.get<int64_t>());
    for (auto v : choice["weight_versions"]) versions.push_back(v.get<int64_t>());
    text += choice["text"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  REQUIRE(static_cast<int64_t>(tokens.size()) == total);  // the full length, as without the update
  REQUIRE(versions.size() == tokens.size());
  CHECK(finish == "length");
  CHECK(text == s.tokenizer->decode(tokens, true));
  const auto k = static_cast<size_t>(std::count(versions.begin(), versions.end(), 0));
  REQUIRE(k >= 1);
  REQUIRE(k < tokens.size());
  CHECK(std::all_of(versions.begin() + static_cast<std::ptrdiff_t>(k), versions.end(), [](auto v) { return v == 1; }));
  // Before the swap: the old weights' tokens. After: the new weights' continuation of them.
  CHECK(std::equal(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(k), old_tokens.begin()));
  auto context = prompt;
  context.insert(context.end(), tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(k));
  const auto new_tokens =
      engine_run(s, {.prompt = context, .n = 1, .max_new_tokens = total - static_cast<int64_t>(k)}, greedy)[0].tokens;
  const auto after = tokens.begin() + static_cast<std::ptrdiff_t>(k);
  CHECK(std::equal(after, tokens.end(), new_tokens.begin(), new_tokens.end()));
  CHECK(!std::equal(tokens.begin() + static_cast<std::ptrdiff_t>(k), tokens.end(),
                    old_tokens.begin() + static_cast<std::ptrdiff_t>(k)));
  // The recorded turn tells the trainer which weights produced each token.
  const auto rows = s.server->collect_session("partial");
  REQUIRE(rows);
  CHECK(torch::equal(rows->batch.at("rollout_weight_versions")[0], torch::tensor(versions, torch::kLong)));
  CHECK(torch::equal(rows->batch.at("responses")[0], torch::tensor(tokens, torch::kLong)));
}

TEST_CASE("a partial weight update keeps seeded samples a function of (seed, sample, step); drain does not pause") {
  ServedTiny s({}, {}, 16, 256);
  const auto prompt = s.tokenizer->encode("seeded");
  const int64_t total = 300;
  serve::GenerationSpec spec{.prompt = prompt,
                             .n = 2,
                             .max_tokens = total,
                             .sampling = cuda::SamplingOptions{.temperature = 0.8},
                             .seed = 9,
                             .ignore_eos = true};
  inference::DecodeSampling sampling;
  sampling.sampling = spec.sampling;
  sampling.seed = 9;
  const auto old_run = engine_run(s, {.prompt = prompt, .n = 2, .max_new_tokens = total}, sampling);

  auto job = s.loop->submit(spec);
  std::vector<serve::TokenEvent> events;
  while (events.size() < 4) REQUIRE(job->take(events, std::chrono::milliseconds(5000)));
  CHECK(s.loop->update_weights(perturb, serve::WeightUpdateMode::kPartial) == 1);
  auto rest = job->wait_all();
  events.insert(events.end(), rest.begin(), rest.end());
  REQUIRE(job->error().empty());
  for (int64_t j = 0; j < 2; ++j) {
    std::vector<int64_t> tokens, versions;
    for (const auto& e : events) {
      if (e.sample != j) continue;
      tokens.push_back(e.token);
      versions.push_back(e.weight_version);
    }
    REQUIRE(static_cast<int64_t>(tokens.size()) == total);
    const auto k = static_cast<size_t>(std::count(versions.begin(), versions.end(), 0));
    REQUIRE(k >= 1);
    REQUIRE(k < tokens.size());
    const auto& old_tokens = old_run[static_cast<size_t>(j)].tokens;
    CHECK(std::equal(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(k), old_tokens.begin()));
    auto context = prompt;
    context.insert(context.end(), tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(k));
    const auto resumed = engine_run(s,
                                    {.prompt = context,
                                     .n = 1,
                                     .max_new_tokens = total - static_cast<int64_t>(k),
                                     .first_row_id = j,
                                     .first_step = static_cast<int64_t>(k)},
                                    sampling)[0]
                             .tokens;
    CHECK(std::equal(tokens.begin() + static_cast<std::ptrdiff_t>(k), tokens.end(), resumed.begin(), resumed.end()));
  }

  // A drain (the default mode) finishes a running request on the weights it started with.
  auto drained = s.loop->submit(spec);
  std::vector<serve::TokenEvent> first;
  REQUIRE(drained->take(first, std::chrono::milliseconds(5000)));
  CHECK(s.loop->update_weights(perturb) == 2);
  auto all = drained->wait_all();
  all.insert(all.begin(), first.begin(), first.end());
  CHECK(static_cast<int64_t>(all.size()) == 2 * total);
  CHECK(std::all_of(all.begin(), all.end(), [](const auto& e) { return e.weight_version == 1; }));
}

TEST_CASE("POST /v1/weights/update: off by default, bearer token, bad paths named, success bumps weight_version") {
  {
    ServedTiny off;
    auto c = client(off);
    const auto r = post(c, "/v1/weights/update", {{"model_path", "/nonexistent"}}, 403);
    CHECK(r["error"]["message"].get<std::string>().find("--enable-weight-update") != std::string::npos);
  }
  serve::ServeOptions options;
  options.token = "s3cret";
  options.enable_weight_update = true;
  ServedTiny s(options);
  auto c = client(s);
  const httplib::Headers auth{{"Authorization", "Bearer s3cret"}};
  TempDir dir("serve_weights");
  // The weights to load: the served ones, perturbed (the served model itself stays as it is).
  models::NamedTensors tensors;
  for (const auto& item : s.model->named_parameters(true)) tensors.emplace_back(item.key(), item.value().clone());
  const std::string up_name = "model.layers.0.mlp.up_proj.weight";
  at::Tensor loaded_up;
  for (auto& [name, t] : tensors) {
    if (name == up_name) loaded_up = t.add_(1.0);
  }
  REQUIRE(loaded_up.defined());
  const auto file = dir.path / "model.safetensors";
  models::write_safetensors(file, tensors);
  const auto partial_file = dir.path / "partial.safetensors";
  models::write_safetensors(partial_file, {tensors.front()});

  post(c, "/v1/weights/update", {{"model_path", file.string()}}, 401, {{"Authorization", "Bearer wrong"}});
  const auto missing = post(c, "/v1/weights/update", {{"model_path", "/no/such/dir"}}, 400, auth);
  CHECK(missing["error"]["param"] == "model_path");
  CHECK(missing["error"]["message"] ==
        "model_path '/no/such/dir' is neither a model folder nor a .safetensors file on the server");
  std::ofstream(dir.path / "bad.safetensors") << "not a safetensors file";
  const auto corrupt =
      post(c, "/v1/weights/update", {{"model_path", (dir.path / "bad.safetensors").string()}}, 400, auth);
  CHECK(corrupt["error"]["param"] == "model_path");
  CHECK(corrupt["error"]["message"].get<std::string>().find("cannot read model_path") != std::string::npos);
  const auto no_path = post(c, "/v1/weights/update", {{"mode", "partial"}}, 400, auth);
  CHECK(no_path["error"]["param"] == "model_path");
  const auto bad_mode = post(c, "/v1/weights/update", {{"model_path", file.string()}, {"mode", "abort"}}, 400, auth);
  CHECK(bad_mode["error"]["param"] == "mode");
  const auto unfit = post(c, "/v1/weights/update", {{"model_path", partial_file.string()}}, 400, auth);
  CHECK(unfit["error"]["message"].get<std::string>().find("is missing") != std::string::npos);
  CHECK(s.loop->weight_version() == 0);  // nothing was loaded

  const auto ok = post(c, "/v1/weights/update", {{"model_path", file.string()}, {"mode", "partial"}}, 200, auth);
  CHECK(ok["success"] == true);
  CHECK(ok["weight_version"] == 1);
  CHECK(ok["mode"] == "partial");
  CHECK(s.model->named_parameters()[up_name].equal(loaded_up));
  // SGLang's route and a model folder work the same way.
  std::filesystem::create_directories(dir.path / "folder");
  models::write_safetensors(dir.path / "folder" / "model.safetensors", tensors);
  const auto folder = post(c, "/update_weights_from_disk", {{"model_path", (dir.path / "folder").string()}}, 200, auth);
  CHECK(folder["weight_version"] == 2);
  CHECK(folder["mode"] == "drain");
  auto health = c.Get("/health", auth);
  REQUIRE(health);
  CHECK(json::parse(health->body)["weight_version"] == 2);
}

TEST_CASE("top_logprobs: chat and completions in OpenAI's shapes, the chosen token first when greedy") {
  ServedTiny s;
  auto c = client(s);
  const auto r = post(c, "/v1/chat/completions",
                      {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                       {"max_tokens", 6},
                       {"temperature", 0},
                       {"logprobs", true},
                       {"top_logprobs", 3}});
  const auto& content = r["choices"][0]["logprobs"]["content"];
  REQUIRE(!content.empty());
  for (const auto& e : content) {
    REQUIRE(e["top_logprobs"].size() == 3);
    CHECK(e["top_logprobs"][0]["token"] == e["token"]);
    CHECK(e["top_logprobs"][0]["logprob"].get<double>() == Approx(e["logprob"].get<double>()).margin(1e-6));
    CHECK(e["top_logprobs"][1]["logprob"] <= e["top_logprobs"][0]["logprob"]);
    CHECK(e["top_logprobs"][2].contains("bytes"));
  }
  const auto plain = post(c, "/v1/chat/completions",
                          {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                           {"max_tokens", 2},
                           {"temperature", 0},
                           {"logprobs", true}});
  CHECK(plain["choices"][0]["logprobs"]["content"][0]["top_logprobs"].empty());

  const auto comp =
      post(c, "/v1/completions", {{"prompt", "1+2="}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 2}});
  const auto& lp = comp["choices"][0]["logprobs"];
  REQUIRE(lp["top_logprobs"].size() == lp["tokens"].size());
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    const auto& top = lp["top_logprobs"][i];
    CHECK((top.size() == 2 || top.size() == 1));  // two ids with the same text show once
    REQUIRE(top.contains(lp["tokens"][i].get<std::string>()));
    CHECK(top[lp["tokens"][i].get<std::string>()].get<double>() ==
          Approx(lp["token_logprobs"][i].get<double>()).margin(1e-6));
  }
  const auto none = post(c, "/v1/completions", {{"prompt", "1+2="}, {"max_tokens", 2}, {"logprobs", 0}});
  CHECK(none["choices"][0]["logprobs"]["top_logprobs"].is_null());
}

TEST_CASE("clients with different sampling settings share one engine run, each as alone") {
  ServedTiny s({}, {}, 16, 256);
  const auto prompt = s.tokenizer->encode("mix");
  // A long greedy request keeps the run going while the others arrive.
  auto first = s.loop->submit(
      {.prompt = prompt, .n = 1, .max_tokens = 400, .sampling = {.greedy = true}, .seed = {}, .ignore_eos = true});
  std::vector<serve::TokenEvent> started;
  REQUIRE(first->take(started, std::chrono::milliseconds(5000)));
  const std::vector<serve::GenerationSpec> specs{
      {.prompt = prompt, .n = 2, .max_tokens = 12, .sampling = {.temperature = 0.8}, .seed = 4, .ignore_eos = false},
      {.prompt = prompt, .n = 1, .max_tokens = 12, .sampling = {.temperature = 1.2, .top_k = 5}, .seed = 8},
      {.prompt = prompt, .n = 1, .max_tokens = 12, .sampling = {.greedy = true}, .seed = {}, .ignore_eos = true}};
  std::vector<std::shared_ptr<serve::GenerationJob>> jobs;
  for (const auto& spec : specs) jobs.push_back(s.loop->submit(spec));
  for (size_t r = 0; r < specs.size(); ++r) {
    const auto events = jobs[r]->wait_all();
    inference::DecodeSampling sampling;
    sampling.sampling = specs[r].sampling;
    sampling.seed = specs[r].seed.value_or(0);
    if (!specs[r].ignore_eos) sampling.eos_token_ids = {s.tokenizer->eos_token_id()};
    const auto alone =
        engine_run(s, {.prompt = prompt, .n = specs[r].n, .max_new_tokens = specs[r].max_tokens}, sampling);
    for (int64_t j = 0; j < specs[r].n; ++j) {
      std::vector<int64_t> got;
      for (const auto& e : events) {
        if (e.sample == j) got.push_back(e.token);
      }
      CHECK(got == alone[static_cast<size_t>(j)].tokens);
    }
  }
  first->wait_all();
  CHECK(s.loop->stats().runs == 1);  // nobody waited for another run
  CHECK(s.loop->stats().joined_mid_run == 3);
}
