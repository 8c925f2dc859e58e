// Encode throughput of the `tiktoken` npm package (WASM build of the reference
// implementation), o200k_base, on one core. Prints one JSON line.
//
// Usage: node tiktoken_bench.js NODE_MODULES_DIR TEXT_FILE [MIN_SECONDS]
"use strict";
const fs = require("fs");
const path = require("path");

const [modulesDir, textFile, minSecondsArg] = process.argv.slice(2);
if (!modulesDir || !textFile) {
  console.error("usage: node tiktoken_bench.js NODE_MODULES_DIR TEXT_FILE [MIN_SECONDS]");
  process.exit(2);
}
const { get_encoding } = require(path.join(path.resolve(modulesDir), "tiktoken"));
const enc = get_encoding("o200k_base");
const buf = fs.readFileSync(textFile);
const text = buf.toString("utf8");
const minSeconds = Number(minSecondsArg || 2);

let tokens = enc.encode_ordinary(text).length;  // warm-up
let iters = 0;
const start = process.hrtime.bigint();
let elapsed = 0;
while (elapsed < minSeconds) {
  tokens = enc.encode_ordinary(text).length;
  ++iters;
  elapsed = Number(process.hrtime.bigint() - start) / 1e9;
}
enc.free();
console.log(JSON.stringify({
  bench: "tokenizer_encode", impl: "tiktoken-wasm", version: require(path.join(path.resolve(modulesDir), "tiktoken", "package.json")).version,
  bytes: buf.length, tokens, iterations: iters, seconds: elapsed, mb_per_s: (buf.length * iters) / elapsed / 1e6,
}));
