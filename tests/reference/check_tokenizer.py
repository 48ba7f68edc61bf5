#!/usr/bin/python3
"""Checks that Python's sentencepiece, given our .model file, reproduces the C++ token ids.

Usage: /usr/bin/python3 check_tokenizer.py MODEL CASES.json
CASES.json: [{"text": "...", "ids": [...]}, ...] as encoded by the C++ Tokenizer.
Exit code 0 when every text encodes to the same ids and decodes back to itself.
"""
import json
import sys

import sentencepiece as spm


def main():
    sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        cases = json.load(f)
    bad = 0
    for case in cases:
        ids = sp.encode(case["text"])
        if ids != case["ids"]:
            bad += 1
            print(f"ids differ for {case['text']!r}:\n  python {ids}\n  C++    {case['ids']}")
        if sp.decode(ids) != case["text"]:
            bad += 1
            print(f"python round trip differs for {case['text']!r}: {sp.decode(ids)!r}")
    specials = [sp.id_to_piece(i) for i in range(3)]
    if specials != ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]:
        bad += 1
        print(f"special pieces are {specials}")
    print(f"{len(cases)} texts, vocab {sp.get_piece_size()}, {bad} problems")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
