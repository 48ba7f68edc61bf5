#!/usr/bin/python3
"""Writes tests/data/tiny-bpe/tokenizer.json: a small GPT-2-style byte-level BPE made for the
tests, the second tokenizer.json that tokenizer_exact.sh compares with the Rust library.

It differs from MiniMind's files where the format allows: merges as "a b" strings (GPT-2's
older layout) instead of pairs, a ByteLevel post-processor (it adds no ids), 300 merges
learned here from the first records of data/austen.jsonl and the mixed test corpus, and
added tokens beyond the vocabulary of both kinds: "normalized": false ones (the three this
tool needs, at ids 0, 1, 2) and "normalized": true ones ("<think>", its prefix "<th", and
"Emma<", which overlaps "<|im_start|>" in "Emma<|im_start|>"), which the Rust library
looks for only in the text between the others.
Usage: /usr/bin/python3 tests/reference/make_tiny_tokenizer.py   (from the repository root)
"""
import collections
import json
import re

MERGES = 300
SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")


def byte_alphabet():
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174]
    table, nxt = {}, 256
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(nxt)
            nxt += 1
    return table


def main():
    alphabet = byte_alphabet()
    texts = [json.loads(l)["text"] for l in open("data/austen.jsonl", encoding="utf-8")][:300]
    texts += [json.loads(l)["text"] for l in open("tests/data/tokenizer-corpus.jsonl", encoding="utf-8")]
    words = collections.Counter()
    for t in texts:
        for w in SPLIT.findall(t):
            words[tuple(alphabet[b] for b in w.encode("utf-8"))] += 1
    merges = []
    for _ in range(MERGES):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        merged = collections.Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab[alphabet[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = [dict(id=i, content=s, single_word=False, lstrip=False, rstrip=False,
                  normalized=False, special=True) for i, s in enumerate(specials)]
    for s in ["<think>", "<th", "Emma<"]:
        added.append(dict(id=len(vocab) + len(added) - 3, content=s, single_word=False,
                          lstrip=False, rstrip=False, normalized=True, special=False))
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    with open("tests/data/tiny-bpe/tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(vocab) + 3} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()
