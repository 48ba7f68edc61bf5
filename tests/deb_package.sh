#!/usr/bin/env bash
# The .deb: `cpack -G DEB` builds it, dpkg installs it (root only; skipped otherwise), and the
# programs it puts in /usr/bin run from an unrelated directory with the packaged presets and
# corpus; then it is removed again.
# Usage: deb_package.sh BUILD_DIR
set -euo pipefail
BUILD=$(realpath "$1")
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: installing a .deb needs root"
  exit 77
fi
if dpkg-query -W -f '${Status}' minimind-cpp 2> /dev/null | grep -q "ok installed"; then
  echo "skipped: minimind-cpp is installed from a package already; not touching it"
  exit 77
fi
WORK=$(mktemp -d)
trap 'dpkg -P minimind-cpp > /dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
(cd "$BUILD" && cpack -G DEB -B "$WORK" > "$WORK/cpack.log") || { cat "$WORK/cpack.log" >&2; exit 1; }
DEB=$(ls "$WORK"/minimind-cpp_*.deb)
dpkg-deb -f "$DEB" Depends | grep -q "libtorch1.13" ||
  { echo "FAIL: the package does not depend on libtorch1.13" >&2; exit 1; }
dpkg -i "$DEB" > /dev/null
mkdir "$WORK/elsewhere" && cd "$WORK/elsewhere"
/usr/bin/minimind-train --list-presets | grep -q "^moe .*/usr/share/minimind/configs/moe.yaml" ||
  { echo "FAIL: the packaged presets are not found" >&2; /usr/bin/minimind-train --list-presets >&2; exit 1; }
/usr/bin/minimind-train --config moe --print-config 2> /dev/null |
  grep -q 'train: "/usr/share/minimind/data/austen.jsonl"' ||
  { echo "FAIL: the packaged preset does not name the packaged corpus" >&2; exit 1; }
head -n 400 /usr/share/minimind/data/austen.jsonl > small.jsonl
/usr/bin/minimind-train --config moe --prepare-only --set data.train=small.jsonl \
  --set model.vocab_size=1000 2> prepare.err ||
  { echo "FAIL: --prepare-only from the package:" >&2; cat prepare.err >&2; exit 1; }
/usr/bin/minimind-eval --help > /dev/null && /usr/bin/minimind-bench --help > /dev/null
echo "deb: $(basename "$DEB") installs, runs from $PWD, and is removed"
