#!/usr/bin/env bash
# The cost of each balancing method: minimind-bench trains the bench config (preset
# moe-top1: MiniMind's aux loss, top-1) and one variant per method in ONE process, one step
# of each in turn (--variant), so that the machine's speed drifting — by tens of percent
# over seconds on a shared VM — hits every method alike; it prints the median step, tok/s
# and model GFLOP/s of each. Shared experts add model FLOPs by design, so the figure to
# compare is the speed per model FLOP (MFU against one peak), not the step time.
# Usage: scripts/bench-balancing.sh [STEPS [WARMUP]]   (default 16 measured steps, 3 warm-up)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-16}
WARMUP=${2:-3}
BENCH=./build/app/minimind-bench
[ -x "$BENCH" ] || { echo "bench-balancing: build first (scripts/build.sh)" >&2; exit 1; }
# One variant per method of configs/balancing-methods.txt (but the baseline, which is the
# bench config itself), and DeepSeek's fine-grained experts at the bench size.
variants=()
while read -r name sets; do
  case "$name" in ''|'#'*) continue ;; esac
  [ -n "$sets" ] && variants+=(--variant "$name:${sets// /,}")
done < configs/balancing-methods.txt
"$BENCH" --preset moe-top1 --steps "$STEPS" --warmup "$WARMUP" "${variants[@]}" \
  --variant "deepseek-fine-grained:model.num_experts=16,model.num_experts_per_tok=4,model.moe_intermediate_size=224,model.n_shared_experts=1,model.scoring_func=sigmoid,model.router_bias_update_rate=1e-3,model.aux_loss_scope=sequence,model.router_aux_loss_coef=1e-4,model.norm_topk_prob=true"
# Quantile balancing where its statistics cost most (64 experts, top-16): the sign rule's bias
# against QB with either estimator, in one process as above. The histogram is one bincount
# of N x E values per layer and micro-batch; the exact estimator keeps the step's N x E
# values and sorts each column once per step.
echo
"$BENCH" --preset moe-e64k16 --steps "$STEPS" --warmup "$WARMUP" \
  --set model.router_aux_loss_coef=0 --set model.scoring_func=sigmoid \
  --set model.router_bias_update_rate=1e-3 \
  --variant "quantile:model.router_bias_update_rate=0,model.router_bias_rule=quantile" \
  --variant "quantile-exact:model.router_bias_update_rate=0,model.router_bias_rule=quantile,model.qb_estimator=exact"
