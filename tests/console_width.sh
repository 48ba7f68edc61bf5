#!/usr/bin/env bash
# Every line minimind-train prints by default fits in 120 columns, on a terminal (time stamp
# included, the status line too) and piped (the default preset and moe-deepseek, whose
# start-up line and warnings are longer: wrapped at spaces, continued indented),
# with the per-layer load histogram kept: the default preset, a lab preset with 16
# experts (z, bias, sequence aux) and 64 experts; log.console: full prints the rest.
# Usage: console_width.sh BUILD_DIR
set -euo pipefail
unset MINIMIND_CONSOLE_WIDTH  # ctest's one-line-per-message setting: the real width here
BUILD=$(realpath "$1")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
SHORT=(--set train.max_steps=6 --set train.warmup_steps=0 --set train.eval_interval=3
  --set log.interval=2 --set data.max_seq_len=64 --set train.batch_size=4)
width_check() {  # FILE: fails naming the first line wider than 120 columns
  python3 - "$1" <<'PY'
import sys, unicodedata
bad = 0
for n, line in enumerate(open(sys.argv[1], encoding="utf-8"), 1):
    line = line.rstrip("\n")
    w = sum(0 if unicodedata.combining(c) else 1 for c in line)
    if w > 120:
        print(f"FAIL: {sys.argv[1]} line {n} is {w} columns: {line}", file=sys.stderr)
        bad += 1
sys.exit(1 if bad else 0)
PY
}
run() {  # NAME ARGS...: a short run on a terminal (script's pty), its output in NAME.err
  local name=$1
  shift
  local cmd
  cmd=$(printf '%q ' "$BUILD/app/minimind-train" --out "runs/$name" "${SHORT[@]}" "$@")
  script -qec "stty cols 200 2>/dev/null; $cmd" /dev/null < /dev/null > "$name.raw" ||
    { tail -5 "$name.raw" >&2; exit 1; }
  # The terminal's view: colours gone, each status line overwritten by what follows it.
  python3 - "$name.raw" > "$name.err" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read().replace("\r\n", "\n")
text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
for line in text.split("\n"):
    print(line.split("\r")[-1])
PY
}
run moe --config moe.yaml
run deepseek --config moe-deepseek
run e64 --config moe.yaml --set model.num_experts=64 --set model.num_experts_per_tok=2
run full --config moe.yaml --set log.console=full
for f in moe deepseek e64; do
  width_check "$f.err"
  grep -q "  L0 " "$f.err" || { echo "FAIL: no layer rows in $f.err" >&2; exit 1; }
done
# Piped: the same limit, with continuation lines indented under the message.
for preset in moe moe-deepseek; do
  "$BUILD/app/minimind-train" --config "$preset" --out "runs/piped-$preset" "${SHORT[@]}" \
    2> "piped-$preset.err" > /dev/null
  width_check "piped-$preset.err"
done
grep -q "^           [^ ]" piped-moe-deepseek.err ||
  { echo "FAIL: no indented continuation in the piped moe-deepseek output" >&2; exit 1; }
# The histogram: one glyph per expert (4 here), and 64 over one line of its own.
grep -Eq "  L0  [▁▂▃▄▅▆▇█·]{4}  max" moe.err || { echo "FAIL: no histogram in moe.err" >&2; exit 1; }
grep -Eq "  L0  e0   [▁▂▃▄▅▆▇█·]{64}$" e64.err || { echo "FAIL: no 64-glyph row" >&2; exit 1; }
# The full rows hold what the compact ones leave out.
grep -q "∇lm" full.err || { echo "FAIL: log.console=full has no gradient pair" >&2; exit 1; }
if grep -q "∇lm" moe.err; then echo "FAIL: the compact console shows the full rows" >&2; exit 1; fi
echo "console: every line of 3 runs on a terminal and 2 piped within 120 columns"
