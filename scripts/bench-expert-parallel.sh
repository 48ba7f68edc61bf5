#!/usr/bin/env bash
# Expert parallelism on this machine, 2 ranks, in one run of this script:
#  1. memory: MiniMind-3 MoE (hidden 768, 8 layers) with 8 experts, where the routed experts
#     are 95 % of the parameters: peak RSS of each rank with the experts replicated (data
#     parallel, run.expert_parallel 1) and spread (2), STEPS steps then a checkpoint;
#  2. speed: the default preset (moe.yaml) on 2 ranks, replicated and spread: tokens/s, the
#     all-to-all's time and share of the loop, bytes per step to and from the other rank.
# Prints one line per run; the logs stay in the work directory it names.
# Usage: scripts/bench-expert-parallel.sh [STEPS (4) [SPEED_STEPS (40)]]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-4}
SPEED_STEPS=${2:-40}
TRAIN=$PWD/build/app/minimind-train
[ -x "$TRAIN" ] || { echo "bench-expert-parallel: build first (scripts/build.sh)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/bench-ep.XXXXXX)
echo "work dir $WORK"
export MASTER_PORT=${MASTER_PORT:-29533}
"$TRAIN" --config configs/moe.yaml --prepare-only > /dev/null 2>&1

# run NAME CONFIG N [--set ...]: 2 ranks, each under /usr/bin/time for its peak RSS.
run() {
  local name=$1 config=$2 n=$3
  shift 3
  bash scripts/launch-local.sh 2 bash -c 'exec /usr/bin/time -f "rank $RANK peak RSS %M KB" "$0" "$@"' \
    "$TRAIN" --config "$config" --out "$WORK/$name" --set run.expert_parallel="$n" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; exit 1; }
  local rss tok ex
  rss=$(grep -o "rank [0-9] peak RSS [0-9]* KB" "$WORK/$name.log" | sort |
        awk '{printf "rank %s %.0f MB; ", $2, $5 / 1024}')
  tok=$(grep -o "([0-9]* tok/s)" "$WORK/$name/train.log" | tail -1)
  ex=$(grep -o "experts exchanged all-to-all (rank 0): [^(]*([^)]*), [0-9.]* MB per step" \
       "$WORK/$name/train.log" | sed 's/experts exchanged all-to-all (rank 0): //' || true)
  echo "$name: peak RSS ${rss}${tok}${ex:+; exchange $ex}"
}

BIG=(--set model.num_experts=8 --set model.num_experts_per_tok=2 --set train.batch_size=2
     --set data.max_seq_len=128 --set train.accumulation_steps=1 --set train.max_steps="$STEPS"
     --set train.eval_interval=100000 --set train.warmup_steps=1 --set data.train="$PWD/data/austen.jsonl"
     --set data.val_fraction=0 --set run.threads=1)
run big-replicated configs/minimind-3-moe.yaml 1 "${BIG[@]}"
run big-spread configs/minimind-3-moe.yaml 2 "${BIG[@]}"
SMALL=(--set train.max_steps="$SPEED_STEPS" --set train.eval_interval=100000 --set data.val_fraction=0
       --set run.threads=1)
run small-replicated configs/moe.yaml 1 "${SMALL[@]}"
run small-spread configs/moe.yaml 2 "${SMALL[@]}"
