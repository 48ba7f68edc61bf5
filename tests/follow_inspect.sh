#!/usr/bin/env bash
# minimind-eval inspect RUN --follow in a real terminal (tmux) against a running trainer:
# the view shows the run's progress while it trains, and the command ends by itself once
# the trainer has ended, showing the last step.
# Usage: follow_inspect.sh BUILD_DIR
set -euo pipefail
BUILD=$(realpath "$1")
WORK=$(mktemp -d)
SESSION=mm-follow-$$
trap 'tmux kill-session -t "$SESSION" 2>/dev/null || true; kill %1 2>/dev/null || true; rm -rf "$WORK"' EXIT
cd "$WORK"
command -v tmux > /dev/null || { echo "FAIL: tmux is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
"$BUILD/app/minimind-train" --config moe.yaml --out runs/f --set train.max_steps=60 \
  --set train.warmup_steps=0 --set log.interval=5 --set train.eval_interval=30 \
  --set data.max_seq_len=64 --set train.batch_size=4 --threads 1 2> train.err &
for _ in $(seq 120); do [ -s runs/f/metrics.jsonl ] && break; sleep 0.5; done
[ -s runs/f/metrics.jsonl ] || { cat train.err >&2; echo "FAIL: the trainer wrote no log" >&2; exit 1; }
tmux new-session -d -s "$SESSION" -x 120 -y 60 \
  "$BUILD/app/minimind-eval inspect runs/f --follow; echo FOLLOW-ENDED; sleep 60"
sleep 2
early=$(tmux capture-pane -p -t "$SESSION")
grep -q "following; Ctrl-C to stop" <<< "$early" || { echo "$early"; echo "FAIL: not following" >&2; exit 1; }
early_step=$(grep -o "— step [0-9]*" <<< "$early" | head -1 | grep -o "[0-9]*$")
wait %1 || { cat train.err >&2; echo "FAIL: the trainer failed" >&2; exit 1; }
for _ in $(seq 20); do
  tmux capture-pane -p -t "$SESSION" | grep -q FOLLOW-ENDED && break
  sleep 0.5
done
late=$(tmux capture-pane -p -t "$SESSION")
grep -q FOLLOW-ENDED <<< "$late" || { echo "$late"; echo "FAIL: --follow did not end with the run" >&2; exit 1; }
grep -q "— step 60" <<< "$late" || { echo "$late"; echo "FAIL: the last view is not step 60" >&2; exit 1; }
grep -q "the run has ended" <<< "$late" || { echo "FAIL: no end line" >&2; exit 1; }
test "$early_step" -lt 60 || { echo "FAIL: the first view was already the last step" >&2; exit 1; }
echo "follow: redrawn from step $early_step to step 60, ended with the run"
