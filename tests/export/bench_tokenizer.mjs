// Times Hugging Face's pure-JavaScript tokenizers (npm @huggingface/tokenizers, pinned in
// package-lock.json) on a JSONL corpus, for scripts/bench-tokenizer.sh. Only encode() is
// timed (the JSON lines are parsed before the clock starts); one thread, as JavaScript runs.
// Usage: node bench_tokenizer.mjs TOKENIZER.json CORPUS.jsonl
// Prints one JSON line: {"library", "mb", "seconds", "mb_per_s", "tokens"}.
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import {Tokenizer} from "@huggingface/tokenizers";

const [file, corpus] = process.argv.slice(2);
const json = JSON.parse(fs.readFileSync(file, "utf8"));
const configPath = path.join(path.dirname(file), "tokenizer_config.json");
const config = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
const tokenizer = new Tokenizer(json, config);

// The corpus in slices of ~8 MB (a 100 MB corpus as one array of strings would be fine too,
// but a 1 GB one would not).
const lines = readline.createInterface({input: fs.createReadStream(corpus), crlfDelay: Infinity});
let bytes = 0, tokens = 0, seconds = 0, slice = [], sliceBytes = 0;
const run = () => {
  const t0 = process.hrtime.bigint();
  for (const text of slice) tokens += tokenizer.encode(text, {add_special_tokens: false}).ids.length;
  seconds += Number(process.hrtime.bigint() - t0) / 1e9;
  bytes += sliceBytes;
  slice = [];
  sliceBytes = 0;
};
for await (const line of lines) {
  if (!line.trim()) continue;
  const text = JSON.parse(line).text;
  slice.push(text);
  sliceBytes += Buffer.byteLength(text, "utf8");
  if (sliceBytes >= 8 << 20) run();
}
run();
process.stdout.write(JSON.stringify({library: "@huggingface/tokenizers", mb: bytes / 1e6, seconds,
  mb_per_s: bytes / 1e6 / seconds, tokens}) + "\n");
