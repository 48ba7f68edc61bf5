#!/usr/bin/env bash
# Quick start, command 1: install what is needed, build, and run the default training
# (configs/moe.yaml on the shipped corpus data/austen.jsonl). Extra arguments go to
# minimind-train, e.g. `scripts/run-default.sh --set train.max_steps=50`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec ./build/app/minimind-train --config configs/moe.yaml "$@"
