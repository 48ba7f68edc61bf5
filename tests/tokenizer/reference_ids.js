// The reference for minimind-eval tokenize: Hugging Face's Rust `tokenizers` library (the
// one MiniMind's Python uses) through its npm binding. Prints, for each record of a JSONL
// corpus, its ids on one line separated by spaces (no special tokens added).
// With --decode, reads lines of ids instead and prints each line's text as the library
// decodes it, as JSON {"text": ...}; with --vocab-size, prints the vocabulary's size with
// the added tokens.
// Usage: node reference_ids.js TOKENIZER.json CORPUS.jsonl
//        node reference_ids.js TOKENIZER.json IDS.txt --decode
//        node reference_ids.js TOKENIZER.json --vocab-size
"use strict";
const fs = require("fs");
const { Tokenizer } = require("@anush008/tokenizers");

(async () => {
  const [file, input, mode] = process.argv.slice(2);
  const tok = await Tokenizer.fromFile(file);
  if (input === "--vocab-size") {
    process.stdout.write(tok.getVocabSize(true) + "\n");
    return;
  }
  const out = [];
  for (const line of fs.readFileSync(input, "utf8").split("\n")) {
    if (mode === "--decode") {
      if (line === "") continue;
      const ids = line.trim() === "" ? [] : line.trim().split(/\s+/).map(Number);
      out.push(JSON.stringify({ text: await tok.decode(ids, false) }));
      continue;
    }
    if (!line.trim()) continue;
    const encoding = await tok.encode(JSON.parse(line).text, null, { addSpecialTokens: false });
    out.push(encoding.getIds().join(" "));
  }
  process.stdout.write(out.join("\n") + "\n");
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
