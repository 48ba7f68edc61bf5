#!/usr/bin/env bash
# The upcycling study: does an MoE beat a dense model of the same active compute, and is
# upcycling a trained dense model better than continuing it? On the shipped corpus at the
# presets' size (configs/dense.yaml and configs/moe.yaml share it), for each seed:
#   dense           configs/dense.yaml for N steps (the starting point)
#   dense-cont      that dense model trained on for M more steps (train.init_from)
#   up-top1         upcycled into moe.yaml's 4 experts, top-1 without renormalisation
#                   (MiniMind's routing), with He et al.'s output scaling
#   up-top2         upcycled, top-2 with renormalised weights (the dense function exactly)
#   up-drop         as up-top1 with Drop-Upcycling (train.upcycle_drop: 0.5)
#   moe-scratch     configs/moe.yaml from random weights for N + M steps
# Every run sees batch_size x seq tokens per step, so the four continued runs and the
# scratch MoE have seen equal tokens at the end. OUT/compare.html puts them side by side
# (validation loss against tokens and FLOPs, the dense phase counted), and OUT/summary.md is
# the table of final figures with the seed spread.
#
# Usage: scripts/upcycle-study.sh [OUT_DIR]         (default runs/upcycle-study)
#   STUDY_N=N, STUDY_M=M   steps of the dense phase and of the continuation (200, 100)
#   STUDY_SEEDS="a b"      seeds (default "1337 1338")
# A run that already finished in OUT_DIR is kept, so an interrupted study continues.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/upcycle-study}
N=${STUDY_N:-200}
M=${STUDY_M:-100}
SEEDS=${STUDY_SEEDS:-1337 1338}
TRAIN=./build/app/minimind-train
EVAL=./build/app/minimind-eval
[ -x "$TRAIN" ] || { echo "upcycle-study: build first (scripts/build.sh)" >&2; exit 1; }
[ "$N" -gt 20 ] && [ "$M" -gt 20 ] || { echo "upcycle-study: N and M must exceed the 20 warm-up steps" >&2; exit 1; }

mkdir -p "$OUT"
start=$(date +%s)
# train NAME STEPS CONFIG SETS...: one run into OUT/NAME, skipped when it finished before.
train() {
  local name=$1 steps=$2 config=$3
  shift 3
  if [ -d "$OUT/$name/checkpoints/step_$(printf %08d "$steps")" ]; then
    echo "upcycle-study: $name already done"
    return
  fi
  local args=(--config "$config" --out "$OUT/$name" --overwrite --set "run.name=$name"
              --set "train.max_steps=$steps" --set "train.eval_interval=$((M / 4))"
              --set "train.checkpoint_interval=$steps")
  for s in "$@"; do args+=(--set "$s"); done
  echo "upcycle-study: $name starts ($(( $(date +%s) - start )) s so far)"
  "$TRAIN" "${args[@]}" 2> "$OUT/$name.log" ||
    { echo "upcycle-study: $name FAILED:" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  echo "upcycle-study: $name: $(grep -oE "done:.*" "$OUT/$name.log" | tail -1)"
}

dirs=()
for seed in $SEEDS; do
  d="$OUT/dense-$seed"
  train "dense-$seed" "$N" configs/dense.yaml "run.seed=$seed"
  train "dense-cont-$seed" "$M" configs/dense.yaml "run.seed=$seed" "train.init_from=$d"
  up=("run.seed=$seed" "train.init_from=$d" train.init_mode=upcycle)
  train "up-top1-$seed" "$M" configs/moe.yaml "${up[@]}" train.upcycle_scaling=true
  train "up-top2-$seed" "$M" configs/moe.yaml "${up[@]}" model.num_experts_per_tok=2 \
    model.norm_topk_prob=true
  train "up-drop-$seed" "$M" configs/moe.yaml "${up[@]}" train.upcycle_scaling=true \
    train.upcycle_drop=0.5
  train "moe-scratch-$seed" "$((N + M))" configs/moe.yaml "run.seed=$seed"
  for v in dense-cont up-top1 up-top2 up-drop moe-scratch; do dirs+=("$OUT/$v-$seed"); done
done
"$EVAL" compare "${dirs[@]}" --out "$OUT/compare.html"

# The table: each variant's final validation loss per seed, their mean and spread, and the
# tokens and FLOPs behind it (the dense phase included).
python3 - "$OUT" $SEEDS > "$OUT/summary.md" <<'PY'
import json, statistics, sys
out, seeds = sys.argv[1], sys.argv[2:]
def last_eval(run):
    rows = [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl")]
    return [r for r in rows if r["split"] == "eval"][-1]
def upstream(run):
    for line in open(f"{out}/{run}/events.jsonl"):
        e = json.loads(line)
        if e["event"] == "init_from":
            return e.get("source_tokens") or 0, e.get("source_flops") or 0.0
    return 0, 0.0
def sim(run):  # the last logged mean expert similarity, averaged over layers
    rows = [json.loads(l) for l in open(f"{out}/{run}/expert_load.jsonl")]
    rows = [r for r in rows if r["split"] == "train" and r.get("expert_similarity_mean") is not None]
    if not rows: return None
    last = max(r["step"] for r in rows)
    v = [r["expert_similarity_mean"] for r in rows if r["step"] == last]
    return sum(v) / len(v)
print("| variant | " + " | ".join(f"val loss (seed {s})" for s in seeds) +
      " | mean | spread | vs dense-cont, per seed | tokens | training FLOPs | expert similarity |")
print("|---" * (len(seeds) + 7) + "|")
base = [last_eval(f"dense-cont-{s}")["val_loss"] for s in seeds]
for v in ("dense-cont", "up-top1", "up-top2", "up-drop", "moe-scratch"):
    losses, tokens, flops, sims = [], [], [], []
    for s in seeds:
        run = f"{v}-{s}"
        e = last_eval(run)
        t0, f0 = upstream(run)
        losses.append(e["val_loss"]); tokens.append(t0 + e["tokens"]); flops.append(f0 + e["flops"])
        sims.append(sim(run))
    spread = max(losses) - min(losses)
    s_txt = "—" if sims[0] is None else " / ".join(f"{x:.3f}" for x in sims)
    # The same seed shares the dense phase: paired differences cancel most of its noise.
    paired = " / ".join(f"{x - b:+.4f}" for x, b in zip(losses, base))
    print(f"| {v} | " + " | ".join(f"{x:.4f}" for x in losses) +
          f" | {statistics.mean(losses):.4f} | {spread:.4f} | {paired} | {tokens[0]} | {flops[0]:.3e} | {s_txt} |")
PY
cat "$OUT/summary.md"
echo "upcycle-study: done in $(( $(date +%s) - start )) s; open $OUT/compare.html"
