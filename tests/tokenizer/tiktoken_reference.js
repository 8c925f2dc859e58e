// Generates the tokenizer parity corpus and encodes it with the `tiktoken` npm
// package (the reference implementation compiled to WASM), o200k_base,
// ordinary encoding (special-token-like text is plain text).
//
// Usage: node tiktoken_reference.js NODE_MODULES_DIR OUT_FILE [COUNT] [SEED]
// Writes one JSON object per line: {"text": STRING, "ids": [INT, ...]}.
// The corpus is deterministic for a given COUNT and SEED.
"use strict";
const fs = require("fs");
const path = require("path");

const [modulesDir, outFile, countArg, seedArg] = process.argv.slice(2);
if (!modulesDir || !outFile) {
  console.error("usage: node tiktoken_reference.js NODE_MODULES_DIR OUT_FILE [COUNT] [SEED]");
  process.exit(2);
}
const { get_encoding } = require(path.join(path.resolve(modulesDir), "tiktoken"));
const count = Number(countArg || 24000);
let state = Number(seedArg || 20240601) >>> 0;

// mulberry32: small deterministic PRNG.
function rand() {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const pick = (arr) => arr[Math.floor(rand() * arr.length)];
const cp = (lo, hi) => String.fromCodePoint(int(lo, hi));
const repeat = (n, f) => Array.from({ length: n }, f).join("");

// Letter ranges of many scripts (assigned code points only).
const scripts = [
  [0x61, 0x7a], [0x41, 0x5a], [0xc0, 0xd6], [0xd8, 0xf6], [0x100, 0x17f], [0x180, 0x24f],
  [0x391, 0x3a9], [0x3b1, 0x3c9], [0x410, 0x44f], [0x450, 0x45f], [0x531, 0x556], [0x561, 0x586],
  [0x5d0, 0x5ea], [0x627, 0x64a], [0x905, 0x939], [0x985, 0x9b9], [0xb85, 0xb95], [0xe01, 0xe2e],
  [0x10d0, 0x10fa], [0x1200, 0x1248], [0x3041, 0x3096], [0x30a1, 0x30fa], [0x4e00, 0x9fff],
  [0xac00, 0xd7a3], [0x1e00, 0x1eff], [0x1f00, 0x1f15], [0x13a0, 0x13f4], [0x1780, 0x17b3],
  [0x0d05, 0x0d39], [0x0c05, 0x0c39], [0xa000, 0xa48c], [0x20000, 0x2a6df],
];
const combining = [[0x300, 0x36f], [0x591, 0x5bd], [0x64b, 0x65f], [0x93e, 0x94c], [0xe31, 0xe3a], [0x1ab0, 0x1abd], [0x20d0, 0x20f0]];
const digits = [[0x30, 0x39], [0x660, 0x669], [0x966, 0x96f], [0xff10, 0xff19], [0x6f0, 0x6f9], [0xe50, 0xe59]];
const spaces = [" ", " ", " ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\u2009", "\u000b", "\u000c", "\u0085", "\u2028", "\u2029", "\u1680", "\u202f", "\u205f", "\u180e", "\u200b", "\ufeff"];
const punct = ".,;:!?-_()[]{}<>\"'`~@#$%^&*+=|\\/".split("").concat(["…", "—", "–", "«", "»", "“", "”", "‘", "’", "¿", "¡", "。", "、", "，", "！", "؟", "।"]);
const emoji = ["😀", "😂", "🥲", "👍", "👍🏽", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🇯🇵", "🇺🇸", "🇫🇷", "1️⃣", "#️⃣", "❤️", "✨", "🧑‍🚀", "🐈‍⬛", "🫠", "🤌🏻", "👁️‍🗨️", "☕", "🚀", "⚽", "🏴‍☠️"];
const contractions = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'Ve", "'m", "'M", "'ll", "'LL", "'Ll", "'lL", "'d", "'D", "’s", "'ſ", "'x"];
const words = ["I", "you", "YOU", "They", "we", "IT", "don", "DON", "can", "Won", "shouldn", "o", "rock", "n", "y", "all", "it", "she", "HE", "Who", "that"];
const specials = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|endoftext|>", "<|endofprompt|>", "<|call|>", "<|return|>", "<|constrain|>", "<|reserved_200100|>", "<|im_start|>", "<| start |>", "<|", "|>", "<|start", "start|>", "<||>", "<<|end|>>"];
const keywords = ["def", "return", "if", "else", "for", "while", "class", "const", "let", "fn", "int", "void", "import", "from", "struct", "impl", "pub", "async", "await", "lambda", "nullptr", "std::vector<int>", "#include", "SELECT", "WHERE"];

function word() {
  const [lo, hi] = pick(scripts);
  let w = repeat(int(1, 10), () => cp(lo, hi));
  if (rand() < 0.3) w = w[0].toUpperCase() + w.slice(1);
  if (rand() < 0.1) w = w.toUpperCase();
  return w;
}
function ident() {
  const parts = repeat(int(1, 3), () => pick(["get", "set", "x", "value", "Node", "HTTP", "parse", "_", "i", "buf", "len", "2", "Id"]));
  return rand() < 0.5 ? parts : parts.replace(/^[0-9]/, "v");
}
function number() {
  const n = int(0, 6);
  if (n === 0) return String(int(0, 9));
  if (n === 1) return String(int(0, 1e9));
  if (n === 2) return (rand() * 1e6).toFixed(int(0, 5));
  if (n === 3) return int(1, 999) + "," + String(int(0, 999)).padStart(3, "0") + "," + String(int(0, 999)).padStart(3, "0");
  if (n === 4) return repeat(int(1, 40), () => String(int(0, 9)));
  if (n === 5) { const [lo, hi] = pick(digits); return repeat(int(1, 12), () => cp(lo, hi)); }
  return `${int(1900, 2100)}-${String(int(1, 12)).padStart(2, "0")}-${String(int(1, 28)).padStart(2, "0")}`;
}
function whitespace() {
  if (rand() < 0.2) return repeat(int(50, 3000), () => pick([" ", " ", " ", "\n", "\t"]));
  return repeat(int(1, 12), () => pick(spaces));
}
function combined() {
  const [lo, hi] = pick(scripts);
  return repeat(int(1, 6), () => cp(lo, hi) + repeat(int(0, 4), () => { const [a, b] = pick(combining); return cp(a, b); }));
}
function contraction() {
  return pick(words) + pick(contractions) + (rand() < 0.5 ? pick(["", " ", "s", "S", "t"]) : "");
}
function code() {
  const ind = repeat(int(0, 3), () => pick(["    ", "\t", "  "]));
  const lines = [];
  for (let i = int(1, 8); i > 0; --i) {
    lines.push(ind + repeat(int(0, 2), () => "  ") + pick(keywords) + " " + ident() + pick(["(", " = ", "->", "::", ".", "[", " += "]) +
      pick([ident(), number(), JSON.stringify(word()), "x" + "[" + int(0, 99) + "]", "{}", "()"]) + pick([");", ";", ":", " {", "", ")", "]", " }"]));
  }
  return lines.join(pick(["\n", "\r\n", "\n\n"]));
}
function noise() {
  return repeat(int(1, 60), () => (rand() < 0.85 ? String.fromCharCode(int(0x20, 0x7e)) : pick(spaces)));
}
function anyCodepoints() {
  // Random code points from the BMP and SMP, skipping surrogates.
  return repeat(int(1, 30), () => {
    let c;
    do { c = int(0x20, rand() < 0.8 ? 0xffff : 0x1ffff); } while (c >= 0xd800 && c <= 0xdfff);
    return String.fromCodePoint(c);
  });
}
const generators = [
  () => repeat(int(1, 12), () => word() + pick([" ", " ", ", ", ". ", "\n", "", "-"])),
  () => repeat(int(1, 8), () => pick(emoji) + pick(["", " ", "", word()])),
  () => repeat(int(1, 6), () => combined() + pick([" ", "", "\n"])),
  code,
  () => whitespace() + (rand() < 0.7 ? word() : "") + (rand() < 0.5 ? whitespace() : ""),
  () => repeat(int(1, 8), () => number() + pick([" ", "", "x", ".", "%", "\n", "abc"])),
  () => repeat(int(1, 8), () => contraction() + pick([" ", "", "\n", ". "])),
  () => repeat(int(1, 6), () => pick(specials) + pick(["", " ", word(), "\n"])),
  noise,
  anyCodepoints,
  () => repeat(int(2, 10), () => pick([word, number, contraction, whitespace, combined, noise, () => pick(emoji), () => pick(specials), () => pick(punct)])()),
];

const enc = get_encoding("o200k_base");
const out = fs.openSync(outFile + ".tmp", "w");
const seen = new Set();
let written = 0;
// A few fixed strings first.
const fixed = ["hello world", "", " ", "\n", "I'm", "'s", "   \n\n  x", "ſ", "K'S", "123456789", "<|endoftext|>", "\u180e\u180e", "a\u0085b", "x\u2028\u2029y"];
for (let i = 0; written < count; ++i) {
  const text = i < fixed.length ? fixed[i] : pick(generators)();
  if (seen.has(text)) continue;
  seen.add(text);
  const ids = Array.from(enc.encode_ordinary(text));
  fs.writeSync(out, JSON.stringify({ text, ids }) + "\n");
  ++written;
}
fs.closeSync(out);
enc.free();
fs.renameSync(outFile + ".tmp", outFile);
