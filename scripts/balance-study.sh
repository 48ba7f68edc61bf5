#!/usr/bin/env bash
# The balancing study: trains the default preset (configs/moe.yaml) once per balancing
# method, with the same seed, data and steps, then writes OUT/compare.html with
# `minimind-eval compare` (val-loss curves, MaxVio and entropy per layer, final table).
# The baseline (MiniMind's aux loss as the preset sets it) runs with a second seed too, so
# the page shows how far two runs of one method differ by chance.
#
# Usage: scripts/balance-study.sh [OUT_DIR]        (default runs/study)
#   STUDY_STEPS=N   optimizer steps per run (default 80: see docs/balancing.md, "The study")
#   STUDY_ONLY="a b"  run only these methods (names in configs/balancing-methods.txt, and
#                   minimind-aux-seed2); the others are skipped
#   STUDY_JOBS=N    runs trained at once (default 1, all cores each; N > 1: one thread each.
#                   On a 2-core machine two one-thread runs took as long as
#                   one two-thread run after the other, and share the cores' tokens/s)
# A run that already finished in OUT_DIR is kept (delete it to train it again), so an
# interrupted study continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/study}
STEPS=${STUDY_STEPS:-80}
JOBS=${STUDY_JOBS:-1}
TRAIN=./build/app/minimind-train
EVAL=./build/app/minimind-eval
[ -x "$TRAIN" ] || { echo "balance-study: build first (scripts/build.sh)" >&2; exit 1; }

# name | --set overrides on top of configs/moe.yaml: every method of
# configs/balancing-methods.txt, and the baseline again with a second seed.
METHODS=()
while read -r name sets; do
  case "$name" in ''|'#'*) continue ;; esac
  METHODS+=("$name|$sets")
  [ "$name" = minimind-aux ] && METHODS+=("minimind-aux-seed2|run.seed=1338")
done < configs/balancing-methods.txt

mkdir -p "$OUT"
dirs=()
start=$(date +%s)
failed=0
wait_for_slot() {  # wait_for_slot MAX_RUNNING
  while [ "$(jobs -rp | wc -l)" -ge "$1" ]; do wait -n || failed=1; done
}
for entry in "${METHODS[@]}"; do
  name=${entry%%|*}
  sets=${entry#*|}
  if [ -n "${STUDY_ONLY:-}" ] && [[ " $STUDY_ONLY " != *" $name "* ]]; then continue; fi
  dirs+=("$OUT/$name")
  if [ -d "$OUT/$name/checkpoints/step_$(printf %08d "$STEPS")" ]; then
    echo "balance-study: $name already done"
    continue
  fi
  args=(--config configs/moe.yaml --out "$OUT/$name" --set "run.name=$name"
        --set "train.max_steps=$STEPS" --set "train.eval_interval=$((STEPS / 4))"
        --set "train.checkpoint_interval=$STEPS")
  [ "$JOBS" -gt 1 ] && args+=(--set run.threads=1)
  for s in $sets; do args+=(--set "$s"); done
  # An unfinished run (interrupted study) resumes; a new one starts.
  [ -d "$OUT/$name/checkpoints" ] && args+=(--resume)
  wait_for_slot "$JOBS"
  echo "balance-study: $name starts ($(( $(date +%s) - start )) s so far)"
  ( "$TRAIN" "${args[@]}" 2> "$OUT/$name.log" && echo "balance-study: $name: $(grep -oE "done:.*" "$OUT/$name.log" | tail -1)" ) \
    || { echo "balance-study: $name FAILED:" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; } &
done
wait_for_slot 1
[ "$failed" -eq 0 ] || { echo "balance-study: a run failed (its log is in $OUT)" >&2; exit 1; }
"$EVAL" compare "${dirs[@]}" --out "$OUT/compare.html"
echo "balance-study: ${#dirs[@]} runs in $(( $(date +%s) - start )) s; open $OUT/compare.html"
