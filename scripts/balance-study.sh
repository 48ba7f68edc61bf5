#!/usr/bin/env bash
# The balancing study: trains the default preset (configs/moe.yaml) once per balancing
# method of configs/balancing-methods.txt and per seed, with the same data and steps, then
# writes OUT/compare.html with `minimind-eval compare` (val-loss curves, MaxVio and entropy
# per layer, final table) and OUT/summary.md: per method the final validation loss of each
# seed with their mean and spread, MaxVio over training, routing information (MI), the
# routing margin, the live routing change, and the vocabulary specialisation of each layer
# (a hash-routed layer's next to the learned ones'). Two seeds of every method show how far
# two runs of one method differ by chance.
#
# Usage: scripts/balance-study.sh [OUT_DIR]        (default runs/study)
#   STUDY_STEPS=N   optimizer steps per run (default 80: see docs/balancing.md, "The study")
#   STUDY_SEEDS="a b"  seeds (default "1337 1338"); runs are OUT/<method>-<seed>
#   STUDY_ONLY="a b"  run only these methods (names in configs/balancing-methods.txt); the
#                   others are skipped
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
SEEDS=${STUDY_SEEDS:-1337 1338}
TRAIN=./build/app/minimind-train
EVAL=./build/app/minimind-eval
[ -x "$TRAIN" ] || { echo "balance-study: build first (scripts/build.sh)" >&2; exit 1; }

# name-seed | --set overrides on top of configs/moe.yaml: every method of
# configs/balancing-methods.txt with every seed.
METHODS=()
NAMES=()
while read -r name sets; do
  case "$name" in ''|'#'*) continue ;; esac
  if [ -n "${STUDY_ONLY:-}" ] && [[ " $STUDY_ONLY " != *" $name "* ]]; then continue; fi
  NAMES+=("$name")
  for seed in $SEEDS; do METHODS+=("$name-$seed|run.seed=$seed $sets"); done
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

# The table. MaxVio over training: the mean over steps and layers of each step's MaxVio; MI
# and margin: the last log step's, mean over layers; routing change: the mean over log steps
# and layers (the first log step compares with step 0); specialisation: per layer, from analysis.json.
/usr/bin/python3 - "$OUT" "${#NAMES[@]}" "${NAMES[@]}" $SEEDS > "$OUT/summary.md" <<'PY'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
names, seeds = sys.argv[3:3 + n], sys.argv[3 + n:]
def rows(run, f):
    return [json.loads(l) for l in open(f"{out}/{run}/{f}")]
def mean(v):
    v = [x for x in v if x is not None]
    return statistics.mean(v) if v else None
def fmt(x, p=3):
    return "—" if x is None else f"{x:.{p}f}"
def figures(run):
    val = [r for r in rows(run, "metrics.jsonl") if r["split"] == "eval"][-1]["val_loss"]
    load = [r for r in rows(run, "expert_load.jsonl") if r["split"] == "train"]
    last = max(r["step"] for r in load if r.get("mi") is not None) if any(
        r.get("mi") is not None for r in load) else None
    at_last = [r for r in load if r["step"] == last]
    try:
        spec = [l.get("vocab_specialisation") for l in json.load(open(f"{out}/{run}/analysis.json"))["layer"]]
    except (OSError, KeyError, ValueError):
        spec = []
    return dict(val=val, maxvio=mean([r["max_vio"] for r in load]),
                mi=mean([r.get("mi") for r in at_last]),
                margin=mean([r.get("margin") for r in at_last]),
                change=mean([r.get("routing_change") for r in load]), spec=spec)
print("| method | " + " | ".join(f"val loss (seed {s})" for s in seeds) +
      " | mean | spread | MaxVio over training | MI | margin | routing change | specialisation per layer |")
print("|---" * (len(seeds) + 8) + "|")
for name in names:
    f = [figures(f"{name}-{s}") for s in seeds]
    losses = [x["val"] for x in f]
    avg = lambda k: mean([x[k] for x in f])
    spec = " / ".join(fmt(mean([x["spec"][l] if l < len(x["spec"]) else None for x in f]), 2)
                      for l in range(max(len(x["spec"]) for x in f)))
    print(f"| {name} | " + " | ".join(f"{x:.4f}" for x in losses) +
          f" | {statistics.mean(losses):.4f} | {max(losses) - min(losses):.4f} | {fmt(avg('maxvio'), 2)}"
          f" | {fmt(avg('mi'))} | {fmt(avg('margin'), 4)} | {fmt(avg('change'))} | {spec or '—'} |")
PY
cat "$OUT/summary.md"
echo "balance-study: ${#dirs[@]} runs in $(( $(date +%s) - start )) s; open $OUT/compare.html"
