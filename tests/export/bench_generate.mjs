// Greedy generation speed of llama.cpp (node-llama-cpp's prebuilt CPU build) on a GGUF file,
// for scripts/bench-generate.sh to set beside minimind-eval's.
// Usage: node bench_generate.mjs MODEL.gguf TOKENS THREADS PROMPT
// Prints {"tokens": N, "seconds": S, "tokens_per_s": R}: the prompt's evaluation and N
// generated tokens, as minimind-eval generate times them.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, tokens, threads, prompt] = process.argv.slice(2);
const n = Number(tokens);
const llama = await getLlama({gpu: false, build: "never", skipDownload: true,
                              logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const context = await model.createContext({contextSize: 1024, threads: Number(threads),
                                           flashAttention: false});
const sequence = context.getSequence();
const input = [1, ...model.tokenize(prompt, false)];
const start = process.hrtime.bigint();
let generated = 0;
for await (const token of sequence.evaluate(input, {temperature: 0, yieldEogToken: true})) {
  void token;
  if (++generated >= n) break;
}
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
process.stdout.write(JSON.stringify({tokens: generated, seconds, tokens_per_s: generated / seconds}) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
