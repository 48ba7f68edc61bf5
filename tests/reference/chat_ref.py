"""Reference for minimind-eval tokenize --chat: MiniMind's SFT rendering and label rule,
written independently of the C++ side.

render: each conversation of a chat JSONL rendered by a tokenizer_config.json's chat_template
  with Jinja as transformers' apply_chat_template runs it (a sandboxed environment with
  trim_blocks and lstrip_blocks, tojson as json.dumps without ASCII escaping), the messages
  and tools built as MiniMind's SFTDataset.create_chat_prompt builds them (every turn carries
  the five fields its datasets Features declare, None where absent; tools and tool_calls JSON
  strings parsed). Prints {"text": ...} per conversation. PROMPT (default none): "answer"
  renders with add_generation_prompt, "think" also with open_thinking.
labels: each line of ids (the tokenizer's ids of a rendered text), cut at MAX_LEN and padded
  with id 0 as SFTDataset does (MAX_LEN 0: as they are), labelled by generate_labels' rule
  with the ids of "<|im_start|>assistant\\n" and "<|im_end|>\\n". Prints {"ids", "labels"}.

Usage: chat_ref.py render TOKENIZER_CONFIG.json CHAT.jsonl [none|answer|think]
       chat_ref.py labels IDS.txt OPEN_IDS CLOSE_IDS MAX_LEN
"""
import json
import sys

import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIELDS = ("role", "content", "reasoning_content", "tools", "tool_calls")


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def render(config_path, corpus_path, prompt="none"):
    template = json.load(open(config_path, encoding="utf-8"))["chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    compiled = env.from_string(template)
    for line in open(corpus_path, encoding="utf-8"):
        if not line.strip():
            continue
        turns = json.loads(line)["conversations"]
        messages, tools = [], None
        for turn in turns:
            m = {k: turn.get(k) for k in FIELDS}
            if m["role"] == "system" and m["tools"]:
                tools = json.loads(m["tools"]) if isinstance(m["tools"], str) else m["tools"]
            if m["tool_calls"] and isinstance(m["tool_calls"], str):
                m["tool_calls"] = json.loads(m["tool_calls"])
            messages.append(m)
        extra = {"open_thinking": True} if prompt == "think" else {}
        text = compiled.render(messages=messages, tools=tools,
                               add_generation_prompt=prompt != "none", **extra)
        print(json.dumps({"text": text}, ensure_ascii=False))


def labels_of(ids, open_ids, close_ids, max_len):
    """generate_labels: from after each answer header to the end of its closing pair."""
    out = [-100] * len(ids)
    i = 0
    while i < len(ids):
        if ids[i:i + len(open_ids)] != open_ids:
            i += 1
            continue
        start = i + len(open_ids)
        end = start
        while end < len(ids) and ids[end:end + len(close_ids)] != close_ids:
            end += 1
        for j in range(start, min(end + len(close_ids), max_len)):
            out[j] = ids[j]
        i = end + len(close_ids) if end < len(ids) else len(ids)
    return out


def labels(ids_path, open_text, close_text, max_len):
    open_ids = [int(t) for t in open_text.split()]
    close_ids = [int(t) for t in close_text.split()]
    max_len = int(max_len)
    for line in open(ids_path):
        if not line.strip():
            continue
        ids = [int(t) for t in line.split()]
        if max_len > 0:
            ids = ids[:max_len] + [0] * (max_len - len(ids))
        print(json.dumps({"ids": ids, "labels": labels_of(ids, open_ids, close_ids,
                                                           max_len if max_len > 0 else len(ids))}))


if __name__ == "__main__":
    if sys.argv[1] == "render":
        render(*sys.argv[2:5])
    else:
        labels(*sys.argv[2:6])
