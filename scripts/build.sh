#!/usr/bin/env bash
# Configures and builds minimind-cpp into ./build (Release, Ninja, 2 jobs by default), then
# installs minimind-train, minimind-eval, minimind-export and minimind-bench on PATH (/usr/local/bin, with the
# presets and the shipped corpus in /usr/local/share/minimind) when run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j "$JOBS"
if [ "$(id -u)" -eq 0 ]; then
  cmake --install build > /dev/null
  echo "build: installed minimind-train, minimind-eval, minimind-export, minimind-bench in /usr/local/bin"
else
  echo "build: not root, so not installed; the programs are in build/app/" >&2
fi
