// The official `openai` npm client against hyflow-serve (tests/serve/openai_npm.sh starts both):
// models, chat, tools, streaming, logprobs and top_logprobs, n > 1, token ids, and the errors it maps to classes.
import { createRequire } from "node:module";
import assert from "node:assert/strict";

const require = createRequire(process.env.OPENAI_MODULE_DIR + "/");
const OpenAI = require("openai");
const baseURL = process.env.HYFLOW_BASE_URL;
const client = new OpenAI({ baseURL, apiKey: process.env.HYFLOW_API_KEY, maxRetries: 0 });
const model = "hyflow-tiny";
const messages = [{ role: "user", content: "What is 2+2?" }];

async function check(name, fn) {
  await fn();
  console.log("ok - " + name);
}

await check("models.list", async () => {
  const list = await client.models.list();
  assert.equal(list.data[0].id, model);
});

let greedy;
await check("chat completion", async () => {
  greedy = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  assert.equal(greedy.object, "chat.completion");
  assert.equal(greedy.choices[0].message.role, "assistant");
  assert.equal(typeof greedy.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(greedy.choices[0].finish_reason));
  assert.ok(greedy.usage.prompt_tokens > 0);
});

await check("tools", async () => {
  const tools = [{ type: "function", function: { name: "add", description: "adds",
    parameters: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } } } } }];
  const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 8, temperature: 0,
    return_token_ids: true });
  assert.ok(["stop", "length", "tool_calls"].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > greedy.usage.prompt_tokens, "the tools are rendered into the prompt");
  assert.equal(r.prompt_token_ids.length, r.usage.prompt_tokens);
});

await check("streaming equals the whole answer", async () => {
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, greedy.choices[0].message.content);
  assert.equal(finish, greedy.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, greedy.usage.completion_tokens);
});

await check("logprobs", async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, logprobs: true });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const t of lp) assert.ok(t.logprob <= 0 && typeof t.token === "string");
});

await check("top_logprobs, whole and streamed", async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, logprobs: true,
    top_logprobs: 4 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const t of lp) {
    assert.equal(t.top_logprobs.length, 4);
    assert.equal(t.top_logprobs[0].token, t.token);  // greedy: the chosen token is the most likely
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6);
    assert.ok(t.top_logprobs.every((a, i) => i === 0 || a.logprob <= t.top_logprobs[i - 1].logprob));
    assert.ok(Array.isArray(t.top_logprobs[3].bytes));
  }
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0,
    logprobs: true, top_logprobs: 4, stream: true });
  const streamed = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) streamed.push(...(c.logprobs?.content ?? []));
  }
  assert.deepEqual(streamed.map((t) => t.top_logprobs.map((a) => a.token)),
    lp.map((t) => t.top_logprobs.map((a) => a.token)));
  const c = await client.completions.create({ model, prompt: "2+2=", max_tokens: 4, temperature: 0, logprobs: 3 });
  const clp = c.choices[0].logprobs;
  assert.equal(clp.top_logprobs.length, clp.tokens.length);
  clp.tokens.forEach((tok, i) => assert.ok(Math.abs(clp.top_logprobs[i][tok] - clp.token_logprobs[i]) < 1e-6));
  await assert.rejects(client.chat.completions.create({ model, messages, logprobs: true, top_logprobs: 21 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "top_logprobs");
});

await check("n > 1 with a seed", async () => {
  const ask = () => client.chat.completions.create({ model, messages, n: 3, max_tokens: 6, temperature: 1,
    seed: 7 });
  const [a, b] = [await ask(), await ask()];
  assert.equal(a.choices.length, 3);
  assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content));
});

await check("completions with token ids in and out", async () => {
  const r = await client.completions.create({ model, prompt: [10, 11, 12], max_tokens: 5, temperature: 0,
    return_token_ids: true, logprobs: 0 });
  assert.deepEqual(r.prompt_token_ids, [10, 11, 12]);
  assert.equal(r.choices[0].token_ids.length, r.usage.completion_tokens);
  assert.equal(r.choices[0].logprobs.token_logprobs.length, r.usage.completion_tokens);
});

await check("a bad field is a BadRequestError naming it", async () => {
  await assert.rejects(client.chat.completions.create({ model, messages, temperature: 5 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.param, "temperature");
    return true;
  });
});

await check("a wrong key is an AuthenticationError", async () => {
  const wrong = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});
