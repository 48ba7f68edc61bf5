// Chats with a GGUF file as a node-llama-cpp user would: the chat wrapper it resolves for
// the file (from its tokenizer.chat_template) turns each conversation into prompt ids, and
// llama.cpp answers greedily, for the export tests to compare with minimind-eval's.
// Usage: node check_chat.mjs MODEL.gguf CASES.json
//   CASES.json: {"conversations": [conversation, ...], "tokens": N}; a conversation is
//   [{"role": "system" | "user" | "assistant", "content": text}, ...] ending with a user
//   turn. Each is turned into the prompt of its answer, which llama.cpp then writes (at most
//   N tokens, ending at the end-of-turn token). node-llama-cpp opens the answer's think
//   block (MiniMind's open_thinking), as minimind-eval chat --think does.
// Prints one JSON object: {"wrapper": the resolved wrapper's name, "prompts": [[ids]],
// "answers": [[ids of each answer, without the end]], "ended": [bool]}.
import fs from "node:fs";
import {getLlama, LlamaLogLevel, resolveChatWrapper} from "node-llama-cpp";

const [modelPath, casesPath] = process.argv.slice(2);
const cases = JSON.parse(fs.readFileSync(casesPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", skipDownload: true,
                              logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const wrapper = resolveChatWrapper(model);

// node-llama-cpp's chat history: a model turn's text is its response, and the history ends
// with an empty model turn, the answer to come (as LlamaChatSession adds it).
function promptIds(conversation) {
  const chatHistory = conversation.map((m) =>
    m.role === "assistant" ? {type: "model", response: [m.content]} : {type: m.role, text: m.content});
  chatHistory.push({type: "model", response: []});
  const {contextText} = wrapper.generateContextState({chatHistory});
  return Array.from(contextText.tokenize(model.tokenizer));
}

const out = {wrapper: wrapper.wrapperName, prompts: [], answers: [], ended: []};
const longest = Math.max(...cases.conversations.map((c) => promptIds(c).length)) + cases.tokens;
const context = await model.createContext({
  contextSize: Math.max(64, longest + 8), batchSize: Math.max(64, longest + 8), threads: 1,
  flashAttention: false, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
const sequence = context.getSequence();
const end = model.tokens.eot ?? model.tokens.eos;
for (const c of cases.conversations) {
  const prompt = promptIds(c);
  out.prompts.push(prompt);
  await sequence.clearHistory();
  // Greedy: the most likely token each time, fed back, until the end of the turn.
  let res = await sequence.controlledEvaluate(prompt.map(
      (id, i) => (i + 1 === prompt.length ? [id, {generateNext: {probabilities: true}}] : id)));
  let probs = res[res.length - 1].next.probabilities;
  const answer = [];
  let ended = false;
  while (answer.length < cases.tokens) {
    const next = probs.keys().next().value;
    if (next === end) {
      ended = true;
      break;
    }
    answer.push(next);
    res = await sequence.controlledEvaluate([[next, {generateNext: {probabilities: true}}]]);
    probs = res[0].next.probabilities;
  }
  out.answers.push(answer), out.ended.push(ended);
}
process.stdout.write(JSON.stringify(out) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
