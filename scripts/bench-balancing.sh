#!/usr/bin/env bash
# The cost of each balancing method: minimind-bench (preset moe-top1, the bench config) once
# per method, one after the other in this one run, then a table of tokens/s and MFU, each
# relative to the default (MiniMind's aux loss). Shared experts add model FLOPs by design,
# so MFU (model FLOPs per second / the machine's measured fp32 peak) is the figure to compare.
# Usage: scripts/bench-balancing.sh [STEPS]   (default 12 measured steps per method)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-12}
BENCH=./build/app/minimind-bench
[ -x "$BENCH" ] || { echo "bench-balancing: build first (scripts/build.sh)" >&2; exit 1; }
METHODS=(
  "default|"
  "none|model.router_aux_loss_coef=0"
  "sequence-aux|model.aux_loss_scope=sequence"
  "global-aux|model.aux_loss_scope=global"
  "z-loss|model.router_z_loss_coef=1e-3"
  "sigmoid|model.scoring_func=sigmoid"
  "aux-free-bias|model.router_aux_loss_coef=0 model.scoring_func=sigmoid model.router_bias_update_rate=1e-3"
  "capacity-1.0|model.capacity_factor=1.0"
  "capacity-1.25|model.capacity_factor=1.25"
  "shared-expert|model.n_shared_experts=1"
  "random-router|model.router_aux_loss_coef=0 model.router=random"
  "hash-router|model.router_aux_loss_coef=0 model.router=hash"
)
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for entry in "${METHODS[@]}"; do
  name=${entry%%|*}
  args=(--preset moe-top1 --steps "$STEPS" --json)
  for s in ${entry#*|}; do args+=(--set "$s"); done
  echo "bench-balancing: $name" >&2
  printf '%s\t%s\n' "$name" "$("$BENCH" "${args[@]}" 2>/dev/null)" >> "$OUT"
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
rows = [(l.split("\t")[0], json.loads(l.split("\t")[1])) for l in open(sys.argv[1])]
base = rows[0][1]
print(f"| method | tok/s | tok/s vs default | MFU | MFU vs default | step ms |")
print("|---|---:|---:|---:|---:|---:|")
for name, r in rows:
    print(f"| {name} | {r['tok_s']:,.0f} | {100 * (r['tok_s'] / base['tok_s'] - 1):+.1f} % "
          f"| {100 * r['mfu']:.1f} % | {100 * (r['mfu'] / base['mfu'] - 1):+.1f} % | {r['step_ms']:.0f} |")
PY
