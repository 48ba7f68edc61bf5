#!/usr/bin/env bash
# Renders a run's report.html with headless Chromium into a PNG, as a person would see it.
# Installs Debian's chromium if it is missing (run as root).
# Usage: scripts/screenshot-report.sh RUN_DIR [OUT.png] [WIDTH] [HEIGHT]
set -euo pipefail
RUN_DIR=${1:?usage: screenshot-report.sh RUN_DIR [OUT.png] [WIDTH] [HEIGHT]}
OUT=${2:-$RUN_DIR/report.png}
WIDTH=${3:-1200}
HEIGHT=${4:-1400}
if [ ! -f "$RUN_DIR/report.html" ]; then
  echo "no $RUN_DIR/report.html (write it with: minimind-eval --report $RUN_DIR)" >&2
  exit 1
fi
if ! command -v chromium >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
PROFILE=$(mktemp -d)
trap 'rm -rf "$PROFILE"' EXIT
# The flags keep Chromium from reaching for the network (none here) at start-up.
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$PROFILE" --window-size="$WIDTH,$HEIGHT" \
  --screenshot="$(realpath -m "$OUT")" "file://$(realpath "$RUN_DIR/report.html")" 2>/dev/null
echo "wrote $OUT"
