#!/usr/bin/env bash
# Generation speed of the same model in llama.cpp (node-llama-cpp's prebuilt CPU build, the
# GGUF minimind-export writes) and in minimind-eval generate, one thread each, greedy,
# alternating REPEATS times in one run; prints each run and the medians.
# Usage: scripts/bench-generate.sh [RUN_DIR [TOKENS [REPEATS]]]   (default runs/moe 300 5)
# Needs the test command's npm packages (npm ci --omit=optional --ignore-scripts --prefix
# tests/export).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/moe}
TOKENS=${2:-300}
REPEATS=${3:-5}
PROMPT="It is a truth universally acknowledged"
EXPORT=minimind-export EVAL=minimind-eval
command -v "$EXPORT" > /dev/null || EXPORT=./build/app/minimind-export
command -v "$EVAL" > /dev/null || EVAL=./build/app/minimind-eval
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$EXPORT" "$RUN" --format gguf --out "$WORK/model.gguf" 2> /dev/null
llama=() ours=()
for ((i = 1; i <= REPEATS; i++)); do
  l=$(node tests/export/bench_generate.mjs "$WORK/model.gguf" "$TOKENS" 1 "$PROMPT" |
    /usr/bin/python3 -c 'import json, sys; print(round(json.load(sys.stdin)["tokens_per_s"]))')
  o=$("$EVAL" generate "$RUN" --prompt "$PROMPT" --greedy --ignore-eos --max-new-tokens "$TOKENS" \
    --threads 1 2>&1 > /dev/null | sed -n 's/.*(\([0-9.]*\) tokens\/s.*/\1/p' | cut -d. -f1)
  echo "run $i: llama.cpp $l tokens/s, minimind-eval $o tokens/s"
  llama+=("$l") ours+=("$o")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
echo "median of $REPEATS, $TOKENS greedy tokens, one thread: llama.cpp $(median "${llama[@]}")" \
  "tokens/s, minimind-eval $(median "${ours[@]}") tokens/s"
