// Exports js-tiktoken's o200k_base merge ranks, and the Unicode character
// classes of the reference tokenizer's regex engine, into Flotilla's compact
// binary ranks file, which common/tokenizer loads with one read.
//
// Why the classes: the pre-tokenisation pattern uses \p{L}, \p{N}, \p{M} and
// \s, whose meaning depends on the Unicode version of the regex engine. The
// reference (the `tiktoken` package, Rust compiled to WASM) carries its own
// Unicode tables; PCRE2 carries older ones. To split text exactly as the
// reference does, we read the reference's general-category tables out of its
// WASM data (sorted [first, last] code point pairs) and the tokenizer patches
// PCRE2's classes with the difference. Each table is located by its first
// entries and confirmed against node's own Unicode data (which may be newer,
// so a small difference of newly assigned characters is expected).
//
// Usage: node export_ranks.js NODE_MODULES_DIR OUT_FILE
//
// File layout (all integers little-endian):
//   8 bytes  magic "FLTRANK1"
//   u32      number of ranks N (ids 0..N-1, contiguous)
//   u32      total token byte count B
//   u32[N+1] offsets into the byte blob (offsets[0] = 0, offsets[N] = B)
//   B bytes  the token byte strings, concatenated in rank order
//   u32      number of character classes C
//   C times: 4 bytes name (NUL-padded: Lu Ll Lt Lm Lo M N WS), u32 R,
//            R pairs of u32 (first, last code point), ascending
"use strict";
const fs = require("fs");
const path = require("path");

function main() {
  const [modulesDir, outFile] = process.argv.slice(2);
  if (!modulesDir || !outFile) {
    console.error("usage: node export_ranks.js NODE_MODULES_DIR OUT_FILE");
    process.exit(2);
  }
  const ranksModule = path.join(path.resolve(modulesDir), "js-tiktoken", "dist", "ranks", "o200k_base.cjs");
  if (!fs.existsSync(ranksModule)) {
    console.error(`export_ranks: ${ranksModule} not found; run tools/setup.sh first`);
    process.exit(1);
  }
  const data = require(ranksModule);
  // bpe_ranks: lines "PREFIX OFFSET tok1 tok2 ..." where tok_i (base64) has rank OFFSET+i.
  const byRank = [];
  for (const line of data.bpe_ranks.split("\n")) {
    if (!line) continue;
    const [, offsetStr, ...tokens] = line.split(" ");
    const offset = Number.parseInt(offsetStr, 10);
    tokens.forEach((t, i) => {
      byRank[offset + i] = Buffer.from(t, "base64");
    });
  }
  const n = byRank.length;
  let total = 0;
  for (let i = 0; i < n; ++i) {
    if (!byRank[i]) {
      console.error(`export_ranks: rank ${i} missing; ranks must be contiguous`);
      process.exit(1);
    }
    total += byRank[i].length;
  }
  const header = Buffer.alloc(16 + 4 * (n + 1));
  header.write("FLTRANK1", 0, "latin1");
  header.writeUInt32LE(n, 8);
  header.writeUInt32LE(total, 12);
  let off = 0;
  for (let i = 0; i < n; ++i) {
    header.writeUInt32LE(off, 16 + 4 * i);
    off += byRank[i].length;
  }
  header.writeUInt32LE(off, 16 + 4 * n);
  const classes = exportClasses(path.join(path.resolve(modulesDir), "tiktoken", "tiktoken_bg.wasm"));
  fs.mkdirSync(path.dirname(outFile), { recursive: true });
  const tmp = outFile + ".tmp";
  fs.writeFileSync(tmp, Buffer.concat([header, ...byRank, classes]));
  fs.renameSync(tmp, outFile);
}

// The first entries of each table, and node's view of the same class.
const kClasses = [
  ["Lu", [0x41, 0x5a, 0xc0, 0xd6, 0xd8, 0xde, 0x100, 0x100], /\p{Lu}/u],
  ["Ll", [0x61, 0x7a, 0xb5, 0xb5, 0xdf, 0xf6, 0xf8, 0xff], /\p{Ll}/u],
  ["Lt", [0x1c5, 0x1c5, 0x1c8, 0x1c8, 0x1cb, 0x1cb], /\p{Lt}/u],
  ["Lm", [0x2b0, 0x2c1, 0x2c6, 0x2d1], /\p{Lm}/u],
  ["Lo", [0xaa, 0xaa, 0xba, 0xba, 0x1bb, 0x1bb], /\p{Lo}/u],
  ["M", [0x300, 0x36f, 0x483, 0x489], /\p{M}/u],
  ["N", [0x30, 0x39, 0xb2, 0xb3, 0xb9, 0xb9, 0xbc, 0xbe], /\p{N}/u],
  ["WS", [9, 13, 32, 32, 0x85, 0x85, 0xa0, 0xa0], /[\s\x85]/u],
];

function readTable(buf, off) {
  const out = [];
  let prev = -1;
  for (let p = off; p + 8 <= buf.length; p += 8) {
    const a = buf.readUInt32LE(p), b = buf.readUInt32LE(p + 4);
    if (a <= prev || b < a || b > 0x10ffff) break;
    out.push([a, b]);
    prev = b;
  }
  return out;
}

function nodeMembership(re) {
  const member = new Uint8Array(0x110000);
  for (let c = 0; c < 0x110000; ++c) {
    if (c >= 0xd800 && c <= 0xdfff) continue;
    member[c] = re.test(String.fromCodePoint(c)) ? 1 : 0;
  }
  return member;
}

function exportClasses(wasmFile) {
  if (!fs.existsSync(wasmFile)) {
    console.error(`export_ranks: ${wasmFile} not found; run tools/setup.sh first`);
    process.exit(1);
  }
  const wasm = fs.readFileSync(wasmFile);
  const parts = [];
  const count = Buffer.alloc(4);
  count.writeUInt32LE(kClasses.length);
  parts.push(count);
  for (const [name, first, re] of kClasses) {
    const sig = Buffer.alloc(first.length * 4);
    first.forEach((v, i) => sig.writeUInt32LE(v, i * 4));
    const member = nodeMembership(re);
    let best = null;
    for (let at = wasm.indexOf(sig); at >= 0; at = wasm.indexOf(sig, at + 1)) {
      const table = readTable(wasm, at);
      let diff = 0, size = 0;
      const inTable = new Uint8Array(0x110000);
      for (const [a, b] of table) for (let c = a; c <= b; ++c) inTable[c] = 1;
      for (let c = 0; c < 0x110000; ++c) {
        size += inTable[c];
        if (inTable[c] !== member[c]) ++diff;
      }
      if (best === null || diff < best.diff) best = { table, diff, size };
    }
    // Newly assigned characters differ between Unicode versions; anything
    // larger means the table found is not the class.
    if (best === null || best.diff > 12000 || best.diff > best.size / 2) {
      console.error(`export_ranks: cannot find the reference's ${name} table in ${wasmFile}`);
      process.exit(1);
    }
    const rec = Buffer.alloc(8 + best.table.length * 8);
    rec.write(name, 0, "latin1");
    rec.writeUInt32LE(best.table.length, 4);
    best.table.forEach(([a, b], i) => {
      rec.writeUInt32LE(a, 8 + 8 * i);
      rec.writeUInt32LE(b, 12 + 8 * i);
    });
    parts.push(rec);
  }
  return Buffer.concat(parts);
}

main();
