#!/usr/bin/env bash
# Quick start, command 2: install what is needed, build, and run the whole test suite
# (unit, parity and end-to-end tests; see docs/development.md), then every fuzzing target for a
# short while (MINIMIND_FUZZ_SECONDS each, default 20; 0 skips; scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
# Test-only npm packages, pinned by tests/export/package-lock.json: node-llama-cpp (llama.cpp's
# prebuilt CPU build) and Hugging Face's tokenizers check minimind-export's files. Node.js 20
# or newer (the machine's); nothing is downloaded when the tests run.
if ! node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' 2>/dev/null; then
  echo "test.sh: the export tests need Node.js >= 20 with npm (node --version: $(node --version 2>&1))" >&2
  exit 1
fi
npm ci --omit=optional --ignore-scripts --no-audit --no-fund --prefix tests/export > /dev/null
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
FUZZ_SECONDS=${MINIMIND_FUZZ_SECONDS:-20}
if [ "$FUZZ_SECONDS" -gt 0 ]; then bash scripts/fuzz.sh 1000000 "$FUZZ_SECONDS"; fi
