#!/usr/bin/env bash
# A MiniMind checkpoint with MiniMind's own tokenizer, end to end: a MiniMind-format .pth of
# the real MoE size (configs/minimind-3-moe.yaml; fp16 tensors as MiniMind's trainer saves
# them, made by the reference model) is scored on a text corpus and continues a prompt
# through MiniMind's tokenizer.json; the reference model (tests/reference/minimind_ref.py),
# given the same ids, gives the same loss (to 2e-5) and the same greedy ids.
# (tokenizer_exact checks the ids themselves against Hugging Face's library.)
# Usage: minimind_checkpoint.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
EVAL="$BUILD/app/minimind-eval"
PY=/usr/bin/python3
REF="$SRC/tests/reference/check_minimind_checkpoint.py"
CONFIG="$SRC/configs/minimind-3-moe.yaml"
TOK="$SRC/tests/data/minimind-tokenizer/tokenizer.json"
cd "$WORK"
"$PY" "$REF" make "$CONFIG" minimind.pth 7
# English, Chinese, Japanese, Korean, emoji, code and the chat tokens typed inside text.
head -16 "$SRC/tests/data/tokenizer-corpus.jsonl" > docs.jsonl
"$EVAL" tokenize --tokenizer "$TOK" --data docs.jsonl --special > ids.txt
model=(minimind.pth --config "$CONFIG" --tokenizer "$TOK")
"$EVAL" loss "${model[@]}" --data docs.jsonl --json > loss.json 2> loss.log ||
  { cat loss.log >&2; exit 1; }
"$EVAL" generate "${model[@]}" --prompt "人工智能正在改变 the world," --greedy \
  --max-new-tokens 24 --json > gen.json 2> gen.log || { cat gen.log >&2; exit 1; }
"$PY" "$REF" check "$CONFIG" minimind.pth ids.txt loss.json gen.json
