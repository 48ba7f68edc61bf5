#!/usr/bin/env bash
# Expert parallelism (run.expert_parallel = 2) on two ranks with the real binary:
#  1. 2 ranks x batch 4 with the experts spread over them train as 1 rank x batch 8 (the
#     data-parallel test's tolerance, 1e-5): top-1, top-2, the balancing lab's global aux
#     scope with sigmoid scoring, z-loss and the bias update (also in micro-batch shards, 2
#     threads per rank) and its sequence scope;
#  2. MiniMind's aux loss (per rank, as under data parallelism), top-1 and top-2: equal to
#     data parallelism on 2 ranks (1e-5), and to 1 x 8 as the data-parallel test checks it;
#  3. capacity is per sending rank, as under data parallelism: equal to it (1e-5);
#  4. one checkpoint format: an expert-parallel checkpoint resumed without expert parallelism
#     and the reverse give the losses of uninterrupted runs (1e-5), and minimind-eval reads it;
#  5. a dense run upcycled into experts: 2 x 4 with experts over 2 ranks, and data parallel,
#     as 1 x 8 (1e-5);
#  6. refusals before training: run.expert_parallel differing between ranks, not dividing the
#     ranks; a rank killed mid-run stops the other within seconds, naming it.
# Usage: dist_expert_parallel.sh MINIMIND_TRAIN SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
EVAL=$(dirname "$BIN")/minimind-eval
PY=/usr/bin/python3
WORK=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT; echo "work dir $WORK"
LAUNCH="$SRC/scripts/launch-local.sh"
export MASTER_PORT=$((20000 + ($$ + 7919) % 20000))

head -n 300 "$SRC/data/austen.jsonl" > "$WORK/corpus.jsonl"
# One fp32 library for every run, whatever the CPU: the compared runs must multiply alike.
config() {  # config NAME AUX_COEF [MORE_MODEL_KEYS] (as tests/dist_two_ranks.sh, eps 1e-6 likewise)
  cat > "$WORK/$1.yaml" <<YAML
run: {name: $1, seed: 5, threads: 1, dist_timeout: 60, matmul: onednn}
model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
        vocab_size: 512, max_position_embeddings: 256, use_moe: true, num_experts: 4,
        norm_topk_prob: false, router_aux_loss_coef: $2 ${3:-}}
data: {train: "$WORK/corpus.jsonl", cache_dir: "$WORK/cache", max_seq_len: 64, val_fraction: 0.05}
train: {batch_size: 8, accumulation_steps: 2, max_steps: 12, learning_rate: 2.0e-3, eps: 1.0e-6,
        eval_interval: 6, checkpoint_interval: 3, keep_checkpoints: 5}
log: {interval: 1}
YAML
}
config top1 0.0
config top2 0.0 ", num_experts_per_tok: 2"
config lab 1.0e-2 ", aux_loss_scope: global, scoring_func: sigmoid,
        router_bias_update_rate: 1.0e-2, router_z_loss_coef: 1.0e-3"
config aux 5.0e-4
config aux2 5.0e-4 ", num_experts_per_tok: 2"
config seq 1.0e-2 ", aux_loss_scope: sequence, num_experts_per_tok: 2"
config capacity 0.0 ", num_experts_per_tok: 2, capacity_factor: 1.0"

compare() { "$PY" "$SRC/tests/compare_runs.py" "$@"; }
one() { "$BIN" --config "$WORK/$1.yaml" --out "$WORK/$2" --set train.batch_size=8 "${@:3}" > "$WORK/$2.log" 2>&1; }
two() {
  bash "$LAUNCH" 2 "$BIN" --config "$WORK/$1.yaml" --out "$WORK/$2" --set train.batch_size=4 "${@:3}" \
    > "$WORK/$2.log" 2>&1 || { cat "$WORK/$2.log"; exit 1; }
}
EP=(--set run.expert_parallel=2)

"$BIN" --config "$WORK/top1.yaml" --prepare-only > /dev/null 2>&1  # one cache for all runs

for name in top1 top2 lab seq; do
  one "$name" "$name-1x8"
  two "$name" "$name-ep2" "${EP[@]}"
  grep -q "experts spread over 2 ranks per group (2 of 4 per rank)" "$WORK/$name-ep2.log" ||
    { echo "FAIL: not expert parallel" >&2; exit 1; }
  compare "$WORK/$name-1x8" "$WORK/$name-ep2" 1e-5 "$name 1x8 vs 2x4 experts over 2 ranks"
done
# Upcycled (train.init_from, train.init_mode: upcycle, Drop-Upcycling): every rank upcycles
# the whole model from the seed, then keeps its experts; experts over 2 ranks train as one
# rank, and the experts' similarity (a Gram matrix over the expert group) agrees.
"$BIN" --config "$WORK/top1.yaml" --out "$WORK/dense-src" --set model.use_moe=false \
  --set train.max_steps=6 > "$WORK/dense-src.log" 2>&1 || { cat "$WORK/dense-src.log"; exit 1; }
UPCYCLE=(--set train.init_from="$WORK/dense-src" --set train.init_mode=upcycle
         --set train.upcycle_drop=0.5 --set model.norm_topk_prob=true)
one top2 up-1x8 "${UPCYCLE[@]}"
two top2 up-ep2 "${UPCYCLE[@]}" "${EP[@]}"
compare "$WORK/up-1x8" "$WORK/up-ep2" 1e-5 "upcycled top-2 1x8 vs 2x4 experts over 2 ranks"
two top2 up-dp "${UPCYCLE[@]}"
compare "$WORK/up-1x8" "$WORK/up-dp" 1e-5 "upcycled top-2 1x8 vs 2x4 data parallel"
"$PY" - "$WORK/up-1x8" "$WORK/up-ep2" <<'PY'
import json, sys
def sims(run):
    return [(r["step"], r["layer"], r["expert_similarity"]) for r in map(json.loads, open(run + "/expert_load.jsonl"))
            if r["split"] == "train" and r.get("expert_similarity") is not None]
a, b = sims(sys.argv[1]), sims(sys.argv[2])
assert len(a) == len(b) == 24 and [x[:2] for x in a] == [y[:2] for y in b], (len(a), len(b))
d = max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x[2], y[2]))
print(f"expert similarity, 1 rank vs experts over 2 ranks: {len(a)} records, max |diff| {d:.2g}")
assert d < 1e-5
PY
two lab lab-ep2-shards "${EP[@]}" --set run.threads=2
grep -q "each micro-batch in 2 shards side by side" "$WORK/lab-ep2-shards.log" ||
  { echo "FAIL: the ranks did not train in shards" >&2; exit 1; }
compare "$WORK/lab-1x8" "$WORK/lab-ep2-shards" 1e-5 "lab 1x8 vs 2x4 experts over 2 ranks, 2 shards per rank"
# The exchange's imbalance in the logs: per step and layer, the rows each rank sent to each
# add up to the step's assignments (k = 1; these rows hold no padding), "overload" is the most
# any rank received over the mean, and the report charts it.
"$PY" - "$WORK/lab-ep2-shards" <<'PY'
import json, sys
run = sys.argv[1]
rs = [r for r in map(json.loads, open(run + "/expert_load.jsonl")) if r["split"] == "train"]
assert len(rs) == 24 and all(len(r["exchange"]) == 4 for r in rs), rs[0]
assert all(sum(r["exchange"]) == sum(r["counts"]) for r in rs)
worst = max(max(r["exchange"][0] + r["exchange"][2], r["exchange"][1] + r["exchange"][3]) /
            (sum(r["exchange"]) / 2) for r in rs)
# Megatron's per-rank overload factor, logged as "overload": the same ratio per record.
for r in rs:
    e = r["exchange"]
    want = max(e[0] + e[2], e[1] + e[3]) / (sum(e) / 2)
    assert abs(r["overload"] - want) < 1e-12, (r["step"], r["layer"], r["overload"], want)
print(f"exchange logged for {len(rs)} (step, layer) records; rows sent = assignments; the busiest "
      f"rank received up to {worst:.3f}x the mean (= the logged overload factor)")
assert "most token rows a rank received" in open(run + "/report.html").read()
PY

# MiniMind's aux loss is each rank's own (as under data parallelism): equal to data
# parallelism, and to 1 x 8 as tests/dist_two_ranks.sh checks it.
for name in aux aux2; do
  two "$name" "$name-dp"
  two "$name" "$name-ep2" "${EP[@]}"
  compare "$WORK/$name-dp" "$WORK/$name-ep2" 1e-5 "$name: data parallel vs experts over 2 ranks"
  one "$name" "$name-1x8"
  "$PY" "$SRC/tests/compare_split_aux.py" "$WORK/$name-1x8" "$WORK/$name-ep2" "$name 1x8 vs experts over 2 ranks"
done

# Capacity: each rank keeps at most ceil(cf * k * its tokens / E) assignments per expert
# before sending (per sending rank, as data parallelism computes it per rank).
two capacity capacity-dp
two capacity capacity-ep2 "${EP[@]}"
compare "$WORK/capacity-dp" "$WORK/capacity-ep2" 1e-5 "capacity: data parallel vs experts over 2 ranks"

# One checkpoint format: the step-6 checkpoint of a run with experts over 2 ranks resumed
# without (2 ranks, data parallel), and the reverse; each equals the uninterrupted run of
# the second setting.
resume_as() {  # resume_as FROM_RUN NEW_RUN [SETTINGS]
  cp -r "$WORK/$1" "$WORK/$2"
  rm -rf "$WORK/$2"/checkpoints/step_0000000{7,8,9} "$WORK/$2"/checkpoints/step_000000{10,11,12}
  two lab "$2" --resume "${@:3}"
  grep -q "from step 6" "$WORK/$2.log" || { echo "FAIL: $2 did not resume from step 6" >&2; exit 1; }
}
two lab lab-dp
resume_as lab-ep2 lab-ep2-then-dp
compare "$WORK/lab-dp" "$WORK/lab-ep2-then-dp" 1e-5 "lab: experts over 2 ranks to step 6, then data parallel"
resume_as lab-dp lab-dp-then-ep2 "${EP[@]}"
compare "$WORK/lab-ep2" "$WORK/lab-dp-then-ep2" 1e-5 "lab: data parallel to step 6, then experts over 2 ranks"
"$PY" - "$WORK/lab-ep2" "$WORK/lab-dp" <<'PY'
import glob, sys, torch
def last(run, name): return torch.load(sorted(glob.glob(f"{run}/checkpoints/step_*/{name}"))[-1])
w, o = last(sys.argv[1], "model.pth"), last(sys.argv[1], "optimizer.pt")
wd, od = last(sys.argv[2], "model.pth"), last(sys.argv[2], "optimizer.pt")
experts = [k for k in w if ".mlp.experts." in k]
print(f"expert-parallel checkpoint: {len(w)} tensors, {len(experts)} of routed experts (2 layers x 4 x 3), "
      f"{len(o) // 3} parameters with AdamW state; names and shapes as data parallelism's: "
      f"{[(k, v.shape) for k, v in w.items()] == [(k, v.shape) for k, v in wd.items()]}")
assert len(experts) == 24
assert [(k, v.shape) for k, v in w.items()] == [(k, v.shape) for k, v in wd.items()]
assert [(k, v.shape) for k, v in o.items()] == [(k, v.shape) for k, v in od.items()]
PY
"$EVAL" "$WORK/lab-ep2" > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; exit 1; }
"$PY" - "$WORK/eval.log" "$WORK/lab-ep2" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
m = re.search(r"loss ([0-9.]+)", text)
val = [r["val_loss"] for r in map(json.loads, open(sys.argv[2] + "/metrics.jsonl")) if r["split"] == "eval"][-1]
print(f"minimind-eval on the expert-parallel checkpoint: loss {m.group(1)}, the run's last validation {val:.4f}")
assert abs(float(m.group(1)) - val) < 1e-3
PY

# Refusals before training, on every rank.
set +e
( export WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1
  RANK=0 LOCAL_RANK=0 "$BIN" --config "$WORK/top1.yaml" --out "$WORK/mismatch" --set train.batch_size=4 \
    --set run.expert_parallel=2 > "$WORK/mismatch0.log" 2>&1 &
  RANK=1 LOCAL_RANK=1 "$BIN" --config "$WORK/top1.yaml" --out "$WORK/mismatch" --set train.batch_size=4 \
    > "$WORK/mismatch1.log" 2>&1
  wait )
set -e
for r in 0 1; do
  grep -q "the ranks' configs differ: run.expert_parallel (rank $r: $((2 - r)))" "$WORK/mismatch$r.log" ||
    { echo "FAIL: rank $r did not refuse the mismatch" >&2; cat "$WORK/mismatch$r.log"; exit 1; }
done
# Refused before the run directory is touched.
[ ! -e "$WORK/mismatch" ] || { echo "FAIL: the run directory was made despite the mismatch" >&2; exit 1; }
echo "run.expert_parallel 2 on rank 0 and 1 on rank 1: both refused: $(grep -o "the ranks' configs differ.*" "$WORK/mismatch0.log" | head -c 120)"
if bash "$LAUNCH" 2 "$BIN" --config "$WORK/top1.yaml" --out "$WORK/four" --set train.batch_size=4 \
    --set run.expert_parallel=4 > "$WORK/four.log" 2>&1; then
  echo "FAIL: 4 experts' groups of 4 on 2 ranks accepted" >&2; exit 1
fi
grep -q "run.expert_parallel = 4 does not divide the job's 2 ranks" "$WORK/four.log" ||
  { echo "FAIL: no clear refusal" >&2; cat "$WORK/four.log"; exit 1; }
[ ! -e "$WORK/four" ] || { echo "FAIL: the run directory was made" >&2; exit 1; }
echo "run.expert_parallel 4 on 2 ranks: refused"

# A rank killed while the experts are exchanged: the other stops within seconds, naming it.
( export WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r "$BIN" --config "$WORK/top1.yaml" --out "$WORK/dead" --set train.batch_size=4 \
      "${EP[@]}" --set train.max_steps=100000 > "$WORK/dead$r.log" 2>&1 &
    echo $! > "$WORK/dead.pid$r"
  done )
for _ in $(seq 1 1200); do [ -e "$WORK/dead/checkpoints/step_00000003" ] && break; sleep 0.05; done
kill -KILL "$(cat "$WORK/dead.pid1")"
start=$(date +%s)
pid0=$(cat "$WORK/dead.pid0")
for _ in $(seq 1 600); do kill -0 "$pid0" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid0" 2>/dev/null; then kill -9 "$pid0"; echo "FAIL: rank 0 still running 60 s after rank 1 died" >&2; exit 1; fi
grep -qE "rank 1 has ended|failed — rank 1|another rank has ended" "$WORK/dead0.log" ||
  { echo "FAIL: no clear error" >&2; cat "$WORK/dead0.log"; exit 1; }
[ -f "$WORK/dead/checkpoints/step_00000003/model.pth" ] || { echo "FAIL: checkpoint lost" >&2; exit 1; }
echo "rank 1 killed: rank 0 stopped after $(( $(date +%s) - start )) s: $(grep -oE 'rank 0 of 2: .*' "$WORK/dead0.log" | head -c 160)"
echo "PASS"
