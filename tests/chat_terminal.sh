#!/usr/bin/env bash
# minimind-eval chat on a fine-tuned run: in a real terminal (tmux) a conversation with its
# commands (/think on, /reset, an unknown one, /quit ends it); --prompt prints only the answer
# on stdout; --data --json answers each conversation and counts those that close their turn.
# The run: a short pretraining on the shipped corpus, then data.mode sft on the test chats.
# Usage: chat_terminal.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
SESSION=mm-chat-$$
trap 'tmux kill-session -t "$SESSION" 2>/dev/null || true; rm -rf "$WORK"' EXIT
cd "$WORK"
command -v tmux > /dev/null || { echo "FAIL: tmux is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
TRAIN="$BUILD/app/minimind-train"
EVAL="$BUILD/app/minimind-eval"
SHORT=(--set train.warmup_steps=0 --set data.max_seq_len=64 --set train.batch_size=4
  --set train.eval_interval=4 --set data.cache_dir="$WORK/cache" --threads 1)
"$TRAIN" --config moe.yaml --out runs/pre --set train.max_steps=4 "${SHORT[@]}" 2> pre.err ||
  { cat pre.err >&2; echo "FAIL: pretraining" >&2; exit 1; }
"$TRAIN" --config moe.yaml --out runs/sft --set train.max_steps=4 --set train.init_from=runs/pre \
  --set data.mode=sft --set data.train="$SRC/tests/data/chat-corpus.jsonl" \
  --set data.val_fraction=0.2 "${SHORT[@]}" 2> sft.err ||
  { cat sft.err >&2; echo "FAIL: fine-tuning" >&2; exit 1; }

# --prompt: the answer alone on stdout (the log goes to stderr).
"$EVAL" chat runs/sft --prompt "Hello" --greedy --max-new-tokens 6 > answer.txt 2> answer.err
grep -q "loaded" answer.err || { cat answer.err >&2; echo "FAIL: no log on stderr" >&2; exit 1; }
if grep -q "loaded\|compute plan" answer.txt; then
  echo "FAIL: log lines on stdout" >&2; exit 1
fi
[ "$(wc -l < answer.txt)" -ge 1 ] || { echo "FAIL: no answer" >&2; exit 1; }

# --data --json: one answer per conversation with a user turn, the share that closed its turn.
"$EVAL" chat runs/sft --data "$SRC/tests/data/chat-corpus.jsonl" --json --greedy \
  --max-new-tokens 4 > answers.json 2> answers.err
/usr/bin/python3 - answers.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
# Every one of the 21 test conversations has a user turn: each is answered there.
assert j["conversations"] == 21, j["conversations"]
assert len(j["answers"]) == 21
assert j["ended"] == sum(a["ended"] for a in j["answers"])
assert abs(j["ended_share"] - j["ended"] / 21) < 1e-12
assert all(a["tokens"] <= 4 for a in j["answers"])
assert all(a["ended"] == (a["tokens"] < 4) for a in j["answers"])
print(f"--data: {j['conversations']} answered, {j['ended']} closed their turn")
PY

# The terminal: a turn, the commands, /quit.
tmux new-session -d -s "$SESSION" -x 100 -y 200 \
  "$EVAL chat runs/sft --greedy --max-new-tokens 6; echo CHAT-ENDED; sleep 60"
wait_for() {
  for _ in $(seq 60); do
    tmux capture-pane -p -t "$SESSION" | grep -qF "$1" && return 0
    sleep 0.5
  done
  tmux capture-pane -p -t "$SESSION"
  echo "FAIL: '$1' never showed" >&2
  exit 1
}
wait_for "/reset starts again"
tmux send-keys -t "$SESSION" "Hello there" Enter
wait_for "> Hello there"
tmux send-keys -t "$SESSION" "/think on" Enter
wait_for "(thinking on)"
tmux send-keys -t "$SESSION" "/reset" Enter
wait_for "(a new conversation)"
tmux send-keys -t "$SESSION" "/bogus" Enter
wait_for "unknown command /bogus"
tmux send-keys -t "$SESSION" "/quit" Enter
wait_for "CHAT-ENDED"
echo "chat: a turn, /think on, /reset, an unknown command and /quit in a terminal"
