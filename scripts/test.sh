#!/usr/bin/env bash
# Quick start, command 2: install what is needed, build, and run the whole test suite
# (unit, parity and end-to-end tests; see docs/development.md), then every fuzzing target for a
# short while (MINIMIND_FUZZ_SECONDS each, default 20; 0 skips; scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
FUZZ_SECONDS=${MINIMIND_FUZZ_SECONDS:-20}
if [ "$FUZZ_SECONDS" -gt 0 ]; then bash scripts/fuzz.sh 1000000 "$FUZZ_SECONDS"; fi
