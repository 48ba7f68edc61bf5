#!/usr/bin/env bash
# Two ranks on loopback with the real binary and scripts/launch-local.sh:
#  1. dense: 2 ranks x batch 4 end with the same weights and per-step losses as 1 rank x
#     batch 8 on the same rows (1e-5);
#  2. MoE (aux loss off, so the loss is linear in the batch): losses and weights likewise,
#     expert counts equal;
#  2b. the same for the balancing methods that need every rank's counts (global aux scope,
#     aux-loss-free bias, with sigmoid scoring and z-loss; quantile balancing with either
#     estimator): weights (bias included), losses and counts;
#  3. MoE with MiniMind's aux loss: each rank's aux term is computed on its own rows (as
#     MiniMind under DDP does), which is not the aux term of the 8 rows together; so step 1
#     (same weights) has equal LM loss and expert counts, and the loss curves stay within
#     1e-4 (the batch-split term; 3e-4 measured with coefficient 0.01);
#  4. a 2-rank run stopped by SIGTERM resumes under 2 ranks to the same losses as an
#     uninterrupted 2-rank run (bitwise with 1 thread per rank), and 1 rank x batch 8
#     resumes the same checkpoint at the same data position;
#  5. a rank killed with SIGKILL stops the other with a clear error, without a hang;
#  6. a rank that hangs (SIGSTOP) stops the other after run.dist_timeout (5 s here);
#  7. the balancing-lab config in bf16: 2 x 4 trains as 1 x 8 to bf16's resolution.
# Usage: dist_two_ranks.sh MINIMIND_TRAIN SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
PY=/usr/bin/python3
WORK=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT; echo "work dir $WORK"
LAUNCH="$SRC/scripts/launch-local.sh"
# A port of our own: ctest runs tests in parallel.
export MASTER_PORT=$((20000 + $$ % 20000))

head -n 300 "$SRC/data/austen.jsonl" > "$WORK/corpus.jsonl"
# AdamW's eps is 1e-6 here, not torch's 1e-8: weights whose gradient is ~0 (a sum of
# terms that cancel) get steps of ~lr from fp32 rounding noise alone when eps is tiny, so
# two correct runs that merely sum in another order end 1e-4 apart on a handful of the
# 150k weights (measured with eps 1e-8: 5 weights above 1e-5, max 9.9e-5; the loss curves
# agree to 6e-7). tests/test_train_step.cpp shows the same for accumulation, in fp64.
EPS=1.0e-6
# One fp32 library for every run, whatever the CPU: the compared runs must multiply alike.
config() {  # config NAME USE_MOE AUX_COEF [MORE_MODEL_KEYS]
  cat > "$WORK/$1.yaml" <<YAML
run: {name: $1, seed: 5, threads: 1, dist_timeout: 60, matmul: onednn}
model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
        vocab_size: 512, max_position_embeddings: 256, use_moe: $2, num_experts: 4,
        norm_topk_prob: false, router_aux_loss_coef: $3 ${4:-}}
data: {train: "$WORK/corpus.jsonl", cache_dir: "$WORK/cache", max_seq_len: 64, val_fraction: 0.05}
train: {batch_size: 8, accumulation_steps: 2, max_steps: 12, learning_rate: 2.0e-3, eps: $EPS,
        eval_interval: 6, checkpoint_interval: 3, keep_checkpoints: 2}
log: {interval: 1}
YAML
}
config dense false 0.0
config moe true 0.0
config moeaux true 5.0e-4  # MiniMind's default coefficient
# The balancing lab's methods that read the whole step: global aux (counts of both
# micro-batches on both ranks), the bias update (the step's counts of both ranks), with
# sigmoid scoring and z-loss; each is linear in the rows, so 2 x 4 must equal 1 x 8.
config moelab true 1.0e-2 ", aux_loss_scope: global, scoring_func: sigmoid,
        router_bias_update_rate: 1.0e-2, router_z_loss_coef: 1.0e-3"
# Quantile balancing: the bias is solved from the step's statistics of both ranks (the
# exact r of every token, or the summed histograms), so two ranks give one rank's bias.
config moeqb true 0.0 ", scoring_func: sigmoid, router_bias_rule: quantile, qb_estimator: exact"
config moeqbhist true 0.0 ", scoring_func: sigmoid, router_bias_rule: quantile"

# Compares two run directories: final weights, per-step train losses, eval losses and
# (MoE) per-step expert counts.
compare() { "$PY" "$SRC/tests/compare_runs.py" "$@"; }

one() { "$BIN" --config "$WORK/$1.yaml" --out "$WORK/$2" --set train.batch_size=8 "${@:3}" > "$WORK/$2.log" 2>&1; }
two() { bash "$LAUNCH" 2 "$BIN" --config "$WORK/$1.yaml" --out "$WORK/$2" --set train.batch_size=4 "${@:3}" > "$WORK/$2.log" 2>&1; }

"$BIN" --config "$WORK/dense.yaml" --prepare-only > /dev/null 2>&1  # one cache for all runs

for name in dense moe moelab moeqb moeqbhist; do
  one "$name" "$name-1x8"
  two "$name" "$name-2x4" || { cat "$WORK/$name-2x4.log"; exit 1; }
  grep -q "2 ranks: all-reduce" "$WORK/$name-2x4.log" || { echo "FAIL: no all-reduce line" >&2; exit 1; }
  compare "$WORK/$name-1x8" "$WORK/$name-2x4" 1e-5 "$name 1x8 vs 2x4"
done
# Each rank with two threads trains its micro-batches in 2 shards side by side: the global
# aux scope then sums the shards' counts, then the ranks' (once per shard group).
two moelab moelab-2x4-shards --set run.threads=2 || { cat "$WORK/moelab-2x4-shards.log"; exit 1; }
grep -q "each micro-batch in 2 shards side by side" "$WORK/moelab-2x4-shards.log" ||
  { echo "FAIL: the ranks did not train in shards" >&2; exit 1; }
compare "$WORK/moelab-1x8" "$WORK/moelab-2x4-shards" 1e-5 "moelab 1x8 vs 2x4 in 2 shards per rank"
# bf16 mixed precision over two ranks: the same products on fewer rows; the tolerance is
# bf16's (a last-bit difference moved across a bf16 rounding boundary is a 2^-8 step there).
# Without the bias update: its sign step turns such a difference in one expert's count into
# a whole 1e-2 step of that expert's bias, after which the runs route differently (seen:
# 94 % of a step's assignments); the fp32 runs above check the bias under two ranks exactly.
BF16=(--set run.precision=bf16 --set run.bf16_emulation=true --set model.router_bias_update_rate=0)
one moelab moelab-bf16-1x8 "${BF16[@]}"
two moelab moelab-bf16-2x4 "${BF16[@]}" || { cat "$WORK/moelab-bf16-2x4.log"; exit 1; }
grep -q "matrix products in bf16" "$WORK/moelab-bf16-2x4.log" || { echo "FAIL: not bf16" >&2; exit 1; }
# Measured (2026-12-02, bias update off): loss 9.8e-5, weights 1.1e-2 relative, 7.9 % of a
# step's assignments routed differently (near-ties fall either way once weights differ in
# bf16's last bits; the routing weights' gradient carries bf16 rounding as autocast's does,
# routed_experts_fused.cpp); fp32 above: 1e-5 and equal counts. The largest step's share is
# chaotic, so the check is on the mean over the 24 (step, layer) records, with a loose bound
# on the largest. Measured 2026-12-05 (0e94f9e / d40befc): seed 5 mean 1.7 % / under 1 %,
# largest 17 % (one layer, step 11) / 1.4 %; seeds 6 and 7 largest 1.0 and 3.5 % / 2.9 and
# 7.2 %: no build is consistently closer. A real batch-split error moves far more.
"$PY" - "$WORK/moelab-bf16-1x8" "$WORK/moelab-bf16-2x4" <<'PY'
import json, sys, glob, torch
a, b = sys.argv[1], sys.argv[2]
def final(run): return sorted(glob.glob(run + "/checkpoints/step_*/model.pth"))[-1]
wa, wb = torch.load(final(a)), torch.load(final(b))
# weights relative to each tensor's size
dw = max(((wa[k] - wb[k]).norm() / wa[k].norm().clamp_min(1e-12)).item() for k in wa)
L = lambda run, n: [json.loads(l) for l in open(f"{run}/{n}")]
la = [m["loss"] for m in L(a, "metrics.jsonl") if m["split"] == "train"]
lb = [m["loss"] for m in L(b, "metrics.jsonl") if m["split"] == "train"]
dl = max(abs(x - y) for x, y in zip(la, lb))
ca = [r for r in L(a, "expert_load.jsonl") if r["split"] == "train"]
cb = [r for r in L(b, "expert_load.jsonl") if r["split"] == "train"]
shares = [sum(abs(p - q) for p, q in zip(x["counts"], y["counts"])) / 2 / sum(x["counts"]) for x, y in zip(ca, cb)]
moved, mean_moved = max(shares), sum(shares) / len(shares)
print(f"bf16 1x8 vs 2x4: {len(la)} steps, max |train loss diff| {dl:.3g} (tolerance 1e-3), "
      f"max relative weight diff {dw:.3g} (tolerance 5e-2), share of assignments routed "
      f"differently: mean over steps and layers {mean_moved:.3g} (tolerance 0.05), "
      f"largest {moved:.3g} (tolerance 0.3)")
assert len(la) == len(lb) == 12 and dl <= 1e-3 and dw <= 5e-2
assert mean_moved <= 0.05 and moved <= 0.3
PY
one moeaux moeaux-1x8
two moeaux moeaux-2x4
"$PY" "$SRC/tests/compare_split_aux.py" "$WORK/moeaux-1x8" "$WORK/moeaux-2x4" "moe+aux"

# Stopped after the first checkpoint, resumed under 2 ranks (60 steps: long
# enough to be interrupted).
two moeaux full60 --set train.max_steps=60
bash "$LAUNCH" 2 "$BIN" --config "$WORK/moeaux.yaml" --out "$WORK/int" --set train.batch_size=4 \
  --set train.max_steps=60 > "$WORK/int.log" 2>&1 &
launcher=$!
for _ in $(seq 1 1200); do [ -e "$WORK/int/checkpoints/step_00000003" ] && break; sleep 0.05; done
# SIGTERM (what Slurm or Kubernetes send; a background job of a script cannot trap SIGINT,
# and a terminal's Ctrl-C reaches every rank directly anyway).
kill -TERM "$launcher"
rc=0
wait "$launcher" || rc=$?
if [ "$rc" -ne 143 ] || [ -d "$WORK/int/checkpoints/step_00000060" ]; then
  echo "FAIL: SIGTERM: exit $rc (want 143) or the run had already finished" >&2
  cat "$WORK/int.log"
  exit 1
fi
cp -r "$WORK/int" "$WORK/int-1rank"
two moeaux int --resume --set train.max_steps=60
one moeaux int-1rank --resume --set train.max_steps=60
resumed_at=$(grep -o "from step [0-9]*" "$WORK/int-1rank.log" | grep -o "[0-9]*$")
"$PY" - "$WORK/full60" "$WORK/int" "$WORK/int-1rank" "$resumed_at" <<'PY'
import json, sys
def losses(run):
    return [(m["step"], m["loss"]) for m in map(json.loads, open(run + "/metrics.jsonl")) if m["split"] == "train"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print(f"2-rank SIGTERM + resume: {len(b)} steps, losses equal to the uninterrupted run: {a == b}")
assert a == b and len(a) == 60, (a, b)
# The first step after the checkpoint has the same weights and must draw the same rows:
# its loss agrees (a wrong data position changes it by ~1e-2). Later steps drift apart
# through the aux term's batch split, amplified by the routing swings of a fresh MoE.
c, k = losses(sys.argv[3]), int(sys.argv[4])
d = abs(a[k][1] - c[k][1])
print(f"2-rank checkpoint (step {k}) resumed by 1 rank x batch 8: step {k + 1} |loss diff| {d:.3g} "
      f"(tolerance 1e-5)")
assert [s for s, _ in c] == [s for s, _ in a] and d <= 1e-5
PY

# A rank that dies (SIGKILL) or hangs (SIGSTOP): the other stops with a clear error, at
# once or after run.dist_timeout, and the last checkpoint stays intact.
failing_rank() {  # failing_rank NAME SIGNAL TIMEOUT_S -> prints the seconds rank 0 took to stop
  ( export WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1
    for r in 0 1; do
      RANK=$r LOCAL_RANK=$r "$BIN" --config "$WORK/moeaux.yaml" --out "$WORK/$1" --set train.batch_size=4 \
        --set train.max_steps=100000 --set run.dist_timeout="$3" > "$WORK/$1$r.log" 2>&1 &
      echo $! > "$WORK/$1.pid$r"
    done )
  for _ in $(seq 1 1200); do [ -e "$WORK/$1/checkpoints/step_00000003" ] && break; sleep 0.05; done
  kill "-$2" "$(cat "$WORK/$1.pid1")"
  local start pid0
  start=$(date +%s)
  pid0=$(cat "$WORK/$1.pid0")
  for _ in $(seq 1 600); do kill -0 "$pid0" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$(cat "$WORK/$1.pid1")" 2>/dev/null || true
  if kill -0 "$pid0" 2>/dev/null; then
    kill -9 "$pid0"
    echo "FAIL: rank 0 still running 60 s after rank 1 got SIG$2" >&2
    exit 1
  fi
  grep -qE "failed — another rank|another rank has ended" "$WORK/${1}0.log" || { echo "FAIL: no clear error" >&2; cat "$WORK/${1}0.log"; exit 1; }
  [ -f "$WORK/$1/checkpoints/step_00000003/model.pth" ] || { echo "FAIL: checkpoint lost" >&2; exit 1; }
  echo $(( $(date +%s) - start ))
}
t=$(failing_rank dead KILL 60)
echo "rank 1 killed: rank 0 stopped after ${t} s: $(grep -oE '(all-reduce failed|another rank has ended).*' "$WORK/dead0.log" | head -c 200)"
t=$(failing_rank hung STOP 5)
echo "rank 1 hung: rank 0 stopped after ${t} s (run.dist_timeout 5 s)"
[ "$t" -ge 4 ] || { echo "FAIL: rank 0 stopped before the timeout" >&2; exit 1; }
echo "PASS"
