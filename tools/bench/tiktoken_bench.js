// Encode throughput of the `tiktoken` npm package (WASM build of the reference
// implementation), o200k_base, on one core. Prints one JSON line.
//
// Usage: node tiktoken_bench.js NODE_MODULES_DIR TEXT_FILE [MIN_SECONDS] [CHUNK_BYTES]
// CHUNK_BYTES > 0 encodes the text as separate documents of at most that many
// bytes, cut at UTF-8 character boundaries (as tokenizer_bench cuts them).
"use strict";
const fs = require("fs");
const path = require("path");

const [modulesDir, textFile, minSecondsArg, chunkArg] = process.argv.slice(2);
if (!modulesDir || !textFile) {
  console.error("usage: node tiktoken_bench.js NODE_MODULES_DIR TEXT_FILE [MIN_SECONDS]");
  process.exit(2);
}
const { get_encoding } = require(path.join(path.resolve(modulesDir), "tiktoken"));
const enc = get_encoding("o200k_base");
const buf = fs.readFileSync(textFile);
const minSeconds = Number(minSecondsArg || 2);
const chunkBytes = Number(chunkArg || 0);
const docs = [];
if (chunkBytes > 0) {
  for (let start = 0; start < buf.length;) {
    let end = Math.min(start + chunkBytes, buf.length);
    while (end < buf.length && end > start && (buf[end] & 0xc0) === 0x80) --end;
    docs.push(buf.subarray(start, end).toString("utf8"));
    start = end;
  }
} else {
  docs.push(buf.toString("utf8"));
}
const encodeAll = () => {
  let n = 0;
  for (const d of docs) n += enc.encode_ordinary(d).length;
  return n;
};

let tokens = encodeAll();  // warm-up
let iters = 0;
const start = process.hrtime.bigint();
let elapsed = 0;
while (elapsed < minSeconds) {
  tokens = encodeAll();
  ++iters;
  elapsed = Number(process.hrtime.bigint() - start) / 1e9;
}
enc.free();
console.log(JSON.stringify({
  bench: "tokenizer_encode", impl: "tiktoken-wasm", version: require(path.join(path.resolve(modulesDir), "tiktoken", "package.json")).version,
  chunk_bytes: chunkBytes, bytes: buf.length, tokens, iterations: iters, seconds: elapsed, mb_per_s: (buf.length * iters) / elapsed / 1e6,
}));
