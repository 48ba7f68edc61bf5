// Runs a GGUF file with llama.cpp (node-llama-cpp's prebuilt CPU build) and prints what it
// computes, for the export tests to compare with minimind-cpp's own numbers.
// Usage: node check_gguf.mjs MODEL.gguf CASES.json
//   CASES.json: {"texts": [...], "sequences": [[ids...], ...], "greedy": {"prompt": [ids],
//                "tokens": N}}
// Prints one JSON object: {"tokens": [[ids of each text]], "logprobs": [[per position of
// each sequence: log p(next id)]], "top": [[per position: [id, logprob] of the 5 most
// likely]], "greedy": [ids], "chat_template": the file's or null}. Exact comparisons need flash attention off and an F32 KV
// cache (llama.cpp's defaults drift by ~2e-3 in the log-probabilities).
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, casesPath] = process.argv.slice(2);
const cases = JSON.parse(fs.readFileSync(casesPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", skipDownload: true,
                              logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const longest = Math.max(cases.greedy.prompt.length + cases.greedy.tokens,
                         ...cases.sequences.map((s) => s.length));
const context = await model.createContext({
  contextSize: Math.max(64, longest + 8), batchSize: Math.max(64, longest + 8), threads: 1,
  flashAttention: false, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
const sequence = context.getSequence();

// The chat template the file carries (tokenizer.chat_template), null when none.
const chatTemplate = model.fileInfo.metadata?.tokenizer?.chat_template ?? null;
const out = {tokens: [], logprobs: [], top: [], greedy: [], chat_template: chatTemplate};
for (const text of cases.texts) out.tokens.push(Array.from(model.tokenize(text, false)));

for (const ids of cases.sequences) {
  await sequence.clearHistory();
  const res = await sequence.controlledEvaluate(
      ids.map((id, i) => (i + 1 < ids.length ? [id, {generateNext: {probabilities: true}}] : id)));
  const lp = [], top = [];
  for (let i = 0; i + 1 < ids.length; ++i) {
    const probs = res[i].next.probabilities;
    lp.push(Math.log(probs.get(ids[i + 1]) ?? 0));
    top.push(Array.from(probs.entries()).slice(0, 5).map(([id, p]) => [id, Math.log(p)]));
  }
  out.logprobs.push(lp), out.top.push(top);
}

// Greedy continuation: the most likely token each time, fed back.
await sequence.clearHistory();
let res = await sequence.controlledEvaluate(cases.greedy.prompt.map(
    (id, i) => (i + 1 === cases.greedy.prompt.length ? [id, {generateNext: {probabilities: true}}] : id)));
let probs = res[res.length - 1].next.probabilities;
for (let n = 0; n < cases.greedy.tokens; ++n) {
  const next = probs.keys().next().value;
  out.greedy.push(next);
  res = await sequence.controlledEvaluate([[next, {generateNext: {probabilities: true}}]]);
  probs = res[0].next.probabilities;
}
process.stdout.write(JSON.stringify(out) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
