#!/usr/bin/env bash
# Quick start, command 1: install what is needed, build, and run the default training
# (the preset moe = configs/moe.yaml, on the shipped corpus data/austen.jsonl) into runs/moe/.
# Extra arguments go to minimind-train, e.g. `scripts/run-default.sh --set train.max_steps=50`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
# minimind-train refuses to start over an earlier run; keep the last one as runs/moe.previous
# so that this command can simply be run again.
if [ -d runs/moe ] && [[ " $* " != *" --resume "* ]]; then
  rm -rf runs/moe.previous
  mv runs/moe runs/moe.previous
  echo "run-default: moved the earlier run to runs/moe.previous"
fi
# The installed command when build.sh could install it (as root), else the build's.
TRAIN=minimind-train
command -v "$TRAIN" > /dev/null || TRAIN=./build/app/minimind-train
exec "$TRAIN" --config moe.yaml "$@"
