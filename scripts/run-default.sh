#!/usr/bin/env bash
# Quick start, command 1: install what is needed, build, and run the default training
# (configs/moe.yaml on the shipped corpus data/austen.jsonl) into runs/moe/.
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
exec ./build/app/minimind-train --config configs/moe.yaml "$@"
