#!/usr/bin/env bash
# How step time grows with fine-grained experts: the bench config's MoE (preset moe-top1:
# E = 4 experts of width 832, top-1) against E = 8, 16, 32, 64 experts with top-E/4 and
# width 832 * 4 / E, so every variant has the same active and the same total expert
# weights (DeepSeekMoE's fine-grained split). All are trained in ONE process, one step of
# each in turn (minimind-bench --variant), so the machine's drift hits them alike; the
# table gives each variant's median step. Step / E=4 step is the figure docs/benchmarks/ records.
# Usage: scripts/bench-experts.sh [STEPS [WARMUP [THREADS [PRECISION]]]]
#   (default 8 measured steps, 2 warm-up, one thread per core, fp32; PRECISION as run.precision)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-8}
WARMUP=${2:-2}
THREADS=${3:-0}
PRECISION=${4:-fp32}
BENCH=./build/app/minimind-bench
[ -x "$BENCH" ] || { echo "bench-experts: build first (scripts/build.sh)" >&2; exit 1; }
variants=()
for E in 8 16 32 64; do
  variants+=(--variant "E${E}-k$((E / 4)):model.num_experts=${E},model.num_experts_per_tok=$((E / 4)),model.moe_intermediate_size=$((832 * 4 / E))")
done
"$BENCH" --preset moe-top1 --threads "$THREADS" --precision "$PRECISION" --steps "$STEPS" --warmup "$WARMUP" "${variants[@]}" | tee /dev/stderr |
  awk -F'|' '/^\| [dE]/ { gsub(/ /, "", $2); gsub(/ /, "", $3); if (!base) base = $3;
    printf "%s: step %s ms = %.2f x the E=4 step\n", ($2 == "default" ? "E4-k1" : $2), $3, $3 / base }'
