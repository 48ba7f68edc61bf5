#!/usr/bin/env bash
# Every command in the README's ```sh blocks runs as written, with the programs of this
# build first on PATH, in a scratch directory that holds what a fresh clone after Quick start
# holds (scripts/ and a trained runs/moe). Training commands get short --set overrides
# appended (the README's own values come first, so ours win) to keep the test quick.
# Not run: the two Quick start commands (they are this test suite and CI themselves) and
# torchrun (several machines; Debian's torchrun crashes on this one, as the README says).
# Usage: readme_examples.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PATH="$BUILD/app:$PATH"
export MASTER_PORT=$((29700 + RANDOM % 200))
SHORT=(--set train.max_steps=4 --set train.warmup_steps=0 --set train.eval_interval=2
  --set train.checkpoint_interval=2 --set data.max_seq_len=64 --set train.batch_size=4)

cd "$WORK"
ln -s "$SRC/scripts" scripts
# What Quick start's first command leaves: a trained runs/moe (shortened here).
minimind-train --config moe.yaml "${SHORT[@]}" > /dev/null 2> quickstart.err ||
  { cat quickstart.err >&2; exit 1; }

# The ```sh blocks, one command per line (a trailing backslash continues it).
python3 - "$SRC/README.md" > commands.txt <<'PY'
import re, sys
text = open(sys.argv[1]).read()
for block in re.findall(r"```sh\n(.*?)```", text, re.S):
    for cmd in re.sub(r"\\\n\s*", " ", block).splitlines():
        cmd = cmd.split("  #")[0].strip()
        if cmd and not cmd.startswith("#"):
            print(cmd)
PY
ran=0
while IFS= read -r cmd; do
  case "$cmd" in
    "bash scripts/run-default.sh"* | "bash scripts/test.sh"* | torchrun*)
      echo "skipped: $cmd"
      continue
      ;;
  esac
  full=$cmd
  if [[ $cmd == *minimind-train* && $cmd != *--print-config* ]]; then full="$cmd ${SHORT[*]}"; fi
  echo "running: $full"
  if ! bash -c "$full" < /dev/null > out.txt 2> err.txt; then
    echo "FAIL: README command failed: $cmd" >&2
    tail -5 err.txt >&2
    exit 1
  fi
  ran=$((ran + 1))
done < commands.txt
test "$ran" -ge 5 || { echo "FAIL: only $ran README commands ran" >&2; exit 1; }
echo "README: $ran commands ran as written"
