#!/usr/bin/env bash
# End to end with the real binary: a run killed with SIGKILL, and one stopped with SIGINT
# (Ctrl-C), are resumed with --resume and must log exactly the per-step losses of an
# uninterrupted run (one thread: bitwise).
# Usage: e2e_kill_resume.sh MINIMIND_TRAIN SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

head -n 300 "$SRC/data/austen.jsonl" > "$WORK/corpus.jsonl"
cat > "$WORK/tiny.yaml" <<YAML
run: {name: e2e, seed: 3, threads: 1}
model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
        vocab_size: 512, max_position_embeddings: 256, use_moe: true, num_experts: 4,
        norm_topk_prob: false}
data: {train: "$WORK/corpus.jsonl", cache_dir: "$WORK/cache", max_seq_len: 64, val_fraction: 0.05}
train: {batch_size: 8, accumulation_steps: 2, max_steps: 40, learning_rate: 2.0e-3,
        eval_interval: 20, checkpoint_interval: 4, keep_checkpoints: 2}
log: {interval: 1}
YAML

losses() {  # step -> loss of the train entries of a run's metrics.jsonl
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("split") == "train":
        print(j["step"], repr(j["loss"]))' "$1/metrics.jsonl"
}

wait_for() {  # wait up to 60 s for a path to exist
  for _ in $(seq 1 1200); do [ -e "$1" ] && return 0; sleep 0.05; done
  echo "timed out waiting for $1" >&2
  return 1
}

"$BIN" --config "$WORK/tiny.yaml" --out "$WORK/full" > "$WORK/full.log" 2>&1
losses "$WORK/full" > "$WORK/full.losses"

# SIGKILL: nothing is saved on the way down; the resume starts from the newest checkpoint.
"$BIN" --config "$WORK/tiny.yaml" --out "$WORK/killed" > "$WORK/killed.log" 2>&1 &
pid=$!
wait_for "$WORK/killed/checkpoints/step_00000008"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
if [ -d "$WORK/killed/checkpoints/step_00000040" ]; then
  echo "FAIL: the run finished before it was killed" >&2
  exit 1
fi
"$BIN" --config "$WORK/tiny.yaml" --out "$WORK/killed" --resume > "$WORK/killed-resume.log" 2>&1
if ! diff "$WORK/full.losses" <(losses "$WORK/killed"); then
  echo "FAIL: losses after kill -9 + --resume differ from the uninterrupted run" >&2
  exit 1
fi

# SIGINT: the run saves a checkpoint and exits with 130.
"$BIN" --config "$WORK/tiny.yaml" --out "$WORK/int" > "$WORK/int.log" 2>&1 &
pid=$!
wait_for "$WORK/int/checkpoints/step_00000004"
kill -INT "$pid"
status=0
wait "$pid" || status=$?
if [ "$status" -ne 130 ]; then
  echo "FAIL: exit status after SIGINT was $status, expected 130" >&2
  cat "$WORK/int.log" >&2
  exit 1
fi
grep -q "continue with --resume" "$WORK/int.log"
"$BIN" --config "$WORK/tiny.yaml" --out "$WORK/int" --resume > "$WORK/int-resume.log" 2>&1
if ! diff "$WORK/full.losses" <(losses "$WORK/int"); then
  echo "FAIL: losses after SIGINT + --resume differ from the uninterrupted run" >&2
  exit 1
fi
echo "kill -9 and SIGINT runs resumed to the same $(wc -l < "$WORK/full.losses") step losses"
