// Times Hugging Face's Rust tokenizers library (npm binding @anush008/tokenizers, pinned in
// package-lock.json) on a JSONL corpus, for scripts/bench-tokenizer.sh: encodeBatch over
// slices of ~8 MB of records; the library spreads a batch over its own thread pool
// (RAYON_NUM_THREADS sets its size). Only encodeBatch is timed.
// Usage: node bench_ids.js TOKENIZER.json CORPUS.jsonl
// Prints one JSON line: {"library", "mb", "seconds", "mb_per_s", "tokens"}.
"use strict";
const fs = require("fs");
const readline = require("readline");
const { Tokenizer } = require("@anush008/tokenizers");

(async () => {
  const [file, corpus] = process.argv.slice(2);
  const tok = await Tokenizer.fromFile(file);
  const lines = readline.createInterface({ input: fs.createReadStream(corpus), crlfDelay: Infinity });
  let bytes = 0, tokens = 0, seconds = 0, slice = [], sliceBytes = 0;
  const run = async () => {
    if (slice.length === 0) return;
    const t0 = process.hrtime.bigint();
    const out = await tok.encodeBatch(slice, { addSpecialTokens: false });
    seconds += Number(process.hrtime.bigint() - t0) / 1e9;
    for (const e of out) tokens += e.getIds().length;
    bytes += sliceBytes;
    slice = [];
    sliceBytes = 0;
  };
  for await (const line of lines) {
    if (!line.trim()) continue;
    const text = JSON.parse(line).text;
    slice.push(text);
    sliceBytes += Buffer.byteLength(text, "utf8");
    if (sliceBytes >= 8 << 20) await run();
  }
  await run();
  process.stdout.write(JSON.stringify({ library: "tokenizers (Rust, @anush008/tokenizers)",
    mb: bytes / 1e6, seconds, mb_per_s: bytes / 1e6 / seconds, tokens }) + "\n");
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
