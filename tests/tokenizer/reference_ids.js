// The reference for minimind-eval tokenize: Hugging Face's Rust `tokenizers` library (the
// one MiniMind's Python uses) through its npm binding. Prints, for each record of a JSONL
// corpus, its ids on one line separated by spaces (no special tokens added).
// Usage: node reference_ids.js TOKENIZER.json CORPUS.jsonl
"use strict";
const fs = require("fs");
const { Tokenizer } = require("@anush008/tokenizers");

(async () => {
  const [file, corpus] = process.argv.slice(2);
  const tok = await Tokenizer.fromFile(file);
  const out = [];
  for (const line of fs.readFileSync(corpus, "utf8").split("\n")) {
    if (!line.trim()) continue;
    const encoding = await tok.encode(JSON.parse(line).text, null, { addSpecialTokens: false });
    out.push(encoding.getIds().join(" "));
  }
  process.stdout.write(out.join("\n") + "\n");
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
