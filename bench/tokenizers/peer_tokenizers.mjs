// The peer of tokenizer_bench: Hugging Face tokenizers (the Rust library through its Node binding)
// timed the same way: the median of 7 encodings of one word of `length` letters. Prints {"word_ms": ...}.
//   NODE_PATH=/tmp/hf-tok/node_modules node peer_tokenizers.mjs tokenizer.json length
import { createRequire } from "node:module";
import { join } from "node:path";

const require = createRequire(join(process.env.NODE_PATH ?? ".", "x.js"));
const { Tokenizer } = require("tokenizers");
const [tokenizerPath, wordLength] = process.argv.slice(2);
const tok = Tokenizer.fromFile(tokenizerPath);
const options = { addSpecialTokens: false };
const median = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const now = () => Number(process.hrtime.bigint()) / 1e6;

const word = "a".repeat(Number(wordLength));
const wordMs = [];
for (let r = 0; r < 7; ++r) {
  const t0 = now();
  await tok.encode(word, null, options);
  wordMs.push(now() - t0);
}
console.log(JSON.stringify({ word_ms: median(wordMs) }));
