#!/usr/bin/env bash
# Quick start, command 2: install what is needed, build, and run the whole test suite
# (unit tests and PyTorch parity tests; see README "Tests").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
