#!/usr/bin/env bash
# Tokenizer throughput on a large corpus, in one alternating run (per-core speed drifts: the
# figures of one round are comparable with each other, not with another day's):
#   - this tool's tokenizer.json path (MiniMind's tokenizer) and its sentencepiece path (a
#     6,400-piece model this tool trains from the shipped corpus), each on 1 thread and on
#     every core: `minimind-train --prepare-only`, its "tokenised" line (MB of record text
#     per second of the tokenising pass, which reads, encodes and writes) and peak RSS;
#   - Hugging Face's pure-JavaScript tokenizers (tests/export, pinned) and its Rust library
#     (tests/tokenizer's npm binding, pinned; what MiniMind's Python runs) on the same records
#     with the same tokenizer.json: encode time only (the records parsed beforehand), the Rust
#     library on 1 thread and on every core.
# Usage: scripts/bench-tokenizer.sh [SIZE_MB [ROUNDS [WORK_DIR]]]   (default 100 MB, 2 rounds)
# Prints one line per measurement and a table; needs node and npm for the two libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-100}
ROUNDS=${2:-2}
WORK=${3:-$(mktemp -d)}
mkdir -p "$WORK"
TRAIN=$(command -v build/app/minimind-train || command -v minimind-train)
CONFIG=configs/minimind-3-moe.yaml  # vocabulary 6,400, as MiniMind's tokenizer
JSON_TOK=tests/data/minimind-tokenizer/tokenizer.json
CORES=$(nproc)
CORPUS="$WORK/corpus-$SIZE.jsonl"
[ -f "$CORPUS" ] || bash scripts/make-big-corpus.sh "$CORPUS" "$SIZE" >&2
for dir in tests/export tests/tokenizer; do
  [ -d "$dir/node_modules" ] ||
    npm ci --ignore-scripts --no-audit --no-fund --prefix "$dir" > "$WORK/npm.log" 2>&1
done
# The sentencepiece model: what this tool trains from the shipped corpus at 6,400 pieces.
if [ ! -f "$WORK/spm.model" ]; then
  "$TRAIN" --config "$CONFIG" --set data.cache_dir="$WORK/spm-cache" --prepare-only 2> "$WORK/spm.log"
  cp "$(find "$WORK/spm-cache" -name '*.model' | head -1)" "$WORK/spm.model"
fi

# prepare KIND TOKENIZER THREADS: one --prepare-only into a fresh cache.
prepare() {
  local kind=$1 tok=$2 threads=$3 log="$WORK/prepare.log" cache
  # A cache of its own each time: only what this script made is removed from WORK_DIR.
  cache=$(mktemp -d "$WORK/cache.XXXXXX")
  /usr/bin/time -f "peak_rss_kb %M" "$TRAIN" --config "$CONFIG" --set data.train="$CORPUS" \
    --set data.tokenizer="$tok" --set run.threads="$threads" --set data.cache_dir="$cache" \
    --prepare-only 2> "$log"
  rm -rf "$cache"
  local rate rss
  rate=$(grep -o '([0-9.]* MB/s' "$log" | tail -1 | tr -d '(' | cut -d' ' -f1)
  rss=$(awk '/peak_rss_kb/ {print int($2 / 1024)}' "$log")
  echo "$kind threads=$([ "$threads" = 0 ] && echo "$CORES" || echo "$threads") MB/s=$rate peak_rss_MB=$rss"
}
library() {
  local kind=$1 threads=$2 out
  if [ "$kind" = js ]; then
    out=$(node tests/export/bench_tokenizer.mjs "$JSON_TOK" "$CORPUS")
  else
    out=$(RAYON_NUM_THREADS=$threads node tests/tokenizer/bench_ids.js "$JSON_TOK" "$CORPUS")
  fi
  echo "$kind threads=$threads MB/s=$(echo "$out" | python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)["mb_per_s"])')"
}

echo "corpus $CORPUS: $(du -m "$CORPUS" | cut -f1) MB; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $CORES cores"
for round in $(seq "$ROUNDS"); do
  echo "round $round"
  prepare tokenizer.json "$JSON_TOK" 1
  prepare sentencepiece "$WORK/spm.model" 1
  library js 1
  library rust 1
  prepare tokenizer.json "$JSON_TOK" 0
  prepare sentencepiece "$WORK/spm.model" 0
  library rust "$CORES"
done | tee "$WORK/results.txt"
