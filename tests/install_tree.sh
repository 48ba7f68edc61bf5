#!/usr/bin/env bash
# The installed programs work from anywhere: `cmake --install` into a scratch prefix, then,
# from an unrelated directory, a preset by bare name finds the installed corpus, the
# sentencepiece wrapper loads from PREFIX/lib, and a bad name lists the presets.
# Usage: install_tree.sh BUILD_DIR
set -euo pipefail
BUILD=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cmake --install "$BUILD" --prefix "$WORK/prefix" > /dev/null
mkdir "$WORK/elsewhere"
cd "$WORK/elsewhere"
TRAIN="$WORK/prefix/bin/minimind-train"

"$TRAIN" --list-presets > presets.txt
grep -q "^moe .*$WORK/prefix/share/minimind/configs/moe.yaml" presets.txt ||
  { echo "FAIL: moe is not listed from the install:" >&2; cat presets.txt >&2; exit 1; }

"$TRAIN" --config moe --print-config > moe.yaml 2> /dev/null
grep -q "train: \"$WORK/prefix/share/minimind/data/austen.jsonl\"" moe.yaml ||
  { echo "FAIL: the preset's corpus is not the installed one:" >&2; grep train: moe.yaml >&2; exit 1; }

# Tokenizer training goes through the installed libminimind_spm.so (a small corpus: quick).
head -n 400 "$WORK/prefix/share/minimind/data/austen.jsonl" > small.jsonl
"$TRAIN" --config moe.yaml --prepare-only --set data.train=small.jsonl \
  --set model.vocab_size=1000 > prepare.out 2> prepare.err ||
  { echo "FAIL: --prepare-only from the install:" >&2; cat prepare.err >&2; exit 1; }
test -s prepare.out && { echo "FAIL: stdout should stay empty:" >&2; cat prepare.out >&2; exit 1; }
ls cache/tokenizers/*.model cache/tokens/*/train.tok > /dev/null ||
  { echo "FAIL: no tokenizer or token file under ./cache" >&2; exit 1; }

if "$TRAIN" --config nosuch > out.txt 2> err.txt; then
  echo "FAIL: an unknown preset was accepted" >&2; exit 1
fi
grep -q "shipped presets are .*moe" err.txt || { echo "FAIL:" >&2; cat err.txt >&2; exit 1; }
echo "install tree: presets, corpus and tokenizer wrapper found from $WORK/elsewhere"
