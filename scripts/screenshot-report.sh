#!/usr/bin/env bash
# Renders a run's report.html with headless Chromium into a PNG, as a person would see it,
# cut below the last content (HEIGHT is the most it shows). Installs Debian's chromium and
# python3-pil if they are missing (run as root).
# Usage: scripts/screenshot-report.sh RUN_DIR|PAGE.html [OUT.png] [WIDTH] [HEIGHT]
#   (a page: e.g. the balancing study's compare.html)
set -euo pipefail
RUN_DIR=${1:?usage: screenshot-report.sh RUN_DIR|PAGE.html [OUT.png] [WIDTH] [HEIGHT]}
PAGE=$RUN_DIR/report.html
[[ "$RUN_DIR" == *.html ]] && PAGE=$RUN_DIR
OUT=${2:-${PAGE%.html}.png}
WIDTH=${3:-1200}
HEIGHT=${4:-4000}
if [ ! -f "$PAGE" ]; then
  echo "no $PAGE (write a run's report with: minimind-eval report RUN_DIR)" >&2
  exit 1
fi
if ! command -v chromium >/dev/null || ! /usr/bin/python3 -c "import PIL" 2>/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium python3-pil >/dev/null
fi
PROFILE=$(mktemp -d)
trap 'rm -rf "$PROFILE"' EXIT
# The flags keep Chromium from reaching for the network (none here) at start-up.
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$PROFILE" --window-size="$WIDTH,$HEIGHT" \
  --screenshot="$(realpath -m "$OUT")" "file://$(realpath "$PAGE")" 2>/dev/null
# Headless Chromium shoots the whole window: cut the blank rows below the page.
/usr/bin/python3 - "$OUT" <<'PY'
import sys
from PIL import Image, ImageChops
path = sys.argv[1]
img = Image.open(path).convert("RGB")
blank = Image.new("RGB", img.size, img.getpixel((img.width - 1, img.height - 1)))
box = ImageChops.difference(img, blank).getbbox()
if box:
    img.crop((0, 0, img.width, min(img.height, box[3] + 20))).save(path)
PY
echo "wrote $OUT ($(/usr/bin/python3 -c "from PIL import Image; import sys; print('%dx%d' % Image.open(sys.argv[1]).size)" "$OUT"))"
