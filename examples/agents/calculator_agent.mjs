// A black-box agent for hyflow (docs/agents-tools.md, "Black-box agents"): the official `openai`
// npm client, chat completions with `tools`, and a calculator the agent runs itself. It solves
// every prompt of $HYFLOW_PROMPTS_FILE concurrently through the rollout server, tagging each
// prompt's requests with its session id, and writes a reward per prompt to $HYFLOW_REWARDS_FILE.
// The trainer (agents::ExternalAgentRunner) sets OPENAI_BASE_URL, OPENAI_API_KEY and those files;
// OPENAI_MODULE_DIR names the folder of an installed `openai` package (else `import "openai"`).
// Rows: {"session_id", "messages": [...], "ground_truth": "<the answer>"}.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";

const require = createRequire((process.env.OPENAI_MODULE_DIR ?? process.cwd() + "/node_modules/openai") + "/");
const OpenAI = require("openai");

const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: process.env.OPENAI_API_KEY, maxRetries: 0 });
const sessionHeader = process.env.HYFLOW_SESSION_HEADER ?? "X-Session-Id";
const maxTurns = Number(process.env.AGENT_MAX_TURNS ?? 3);
const maxTokens = Number(process.env.AGENT_MAX_TOKENS ?? 24);

const tools = [{
  type: "function",
  function: {
    name: "calculator",
    description: "Exact integer arithmetic: + - * / and parentheses.",
    parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
  },
}];

// The calculator: integers of any size (BigInt), + - * / (truncating) and parentheses.
function calculate(expression) {
  const tokens = String(expression).match(/\d+|[-+*/()]/g) ?? [];
  if (tokens.join("") !== String(expression).replace(/\s+/g, "")) throw new Error("unexpected characters");
  let at = 0;
  const peek = () => tokens[at];
  const atom = () => {
    const t = tokens[at++];
    if (t === "(") { const v = sum(); if (tokens[at++] !== ")") throw new Error("missing )"); return v; }
    if (t === "-") return -atom();
    if (t !== undefined && /^\d+$/.test(t)) return BigInt(t);
    throw new Error("unexpected " + (t ?? "end"));
  };
  const product = () => {
    let v = atom();
    while (peek() === "*" || peek() === "/") {
      const op = tokens[at++], r = atom();
      if (op === "/" && r === 0n) throw new Error("division by zero");
      v = op === "*" ? v * r : v / r;
    }
    return v;
  };
  const sum = () => {
    let v = product();
    while (peek() === "+" || peek() === "-") v = tokens[at++] === "+" ? v + product() : v - product();
    return v;
  };
  const value = sum();
  if (at !== tokens.length) throw new Error("unexpected " + tokens[at]);
  return value.toString();
}

function runTool(call) {
  try {
    if (call.function.name !== "calculator") return "error: unknown tool " + call.function.name;
    return calculate(JSON.parse(call.function.arguments).expression);
  } catch (e) {
    return "error: " + e.message;
  }
}

async function solve(row, model) {
  const messages = [...row.messages];
  let answer = "";
  for (let turn = 0; turn < maxTurns; ++turn) {
    const completion = await client.chat.completions.create(
      { model, messages, tools, max_tokens: maxTokens, temperature: 1.0 },
      { headers: { [sessionHeader]: row.session_id } });
    const message = completion.choices[0].message;
    messages.push({ role: "assistant", content: message.content ?? "",
                    ...(message.tool_calls?.length ? { tool_calls: message.tool_calls } : {}) });
    if (message.tool_calls?.length) {
      for (const call of message.tool_calls)
        messages.push({ role: "tool", tool_call_id: call.id, content: runTool(call) });
      continue;
    }
    answer = message.content ?? "";
    if (answer.includes(String(row.ground_truth))) break;
    messages.push({ role: "user", content: "That is not right. Use the calculator tool and answer again." });
  }
  return { session_id: row.session_id, reward: answer.includes(String(row.ground_truth)) ? 1.0 : 0.0 };
}

const rows = readFileSync(process.env.HYFLOW_PROMPTS_FILE, "utf8").split("\n").filter(Boolean).map(JSON.parse);
const model = (await client.models.list()).data[0].id;
const results = await Promise.all(rows.map((row) => solve(row, model)));
writeFileSync(process.env.HYFLOW_REWARDS_FILE, results.map((r) => JSON.stringify(r)).join("\n") + "\n");
console.log(`solved ${rows.length} prompts, reward ${results.reduce((s, r) => s + r.reward, 0)}`);
