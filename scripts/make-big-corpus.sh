#!/usr/bin/env bash
# Builds a large JSONL corpus from the shipped one, for the gigabyte preparation test
# (docs/data.md, "Large corpora"): copies of data/austen.jsonl, each with its records in an
# order shuffled by the copy's seed and each record's paragraphs rotated by a seeded
# offset, so that no two copies are the same byte stream.
# Usage: scripts/make-big-corpus.sh OUT.jsonl [SIZE_MB]   (default 1000 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/make-big-corpus.sh OUT.jsonl [SIZE_MB]}
SIZE_MB=${2:-1000}
# Never over an existing file (it may be a corpus of the user's), and put in place only once
# complete: an interrupted run leaves no partial corpus that a later run would take as whole.
if [ -e "$OUT" ]; then
  echo "make-big-corpus: '$OUT' exists; remove it or give another name" >&2
  exit 1
fi
PARTIAL="$OUT.partial.$$"
trap 'rm -f "$PARTIAL"' EXIT
/usr/bin/python3 - "$PARTIAL" "$SIZE_MB" <<'PY'
import json, random, sys
out, target = sys.argv[1], int(sys.argv[2]) * 1000 * 1000
records = [json.loads(l)["text"] for l in open("data/austen.jsonl", encoding="utf-8") if l.strip()]
written, seed = 0, 0
with open(out, "w", encoding="utf-8") as f:
    while written < target:
        rng = random.Random(seed)
        order = list(range(len(records)))
        rng.shuffle(order)
        for i in order:
            paras = records[i].split("\n")
            k = rng.randrange(len(paras))
            line = json.dumps({"text": "\n".join(paras[k:] + paras[:k])}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
            if written >= target:
                break
        seed += 1
print(f"{written / 1e6:.0f} MB, {seed} seeded copies", end="")
PY
mv -n "$PARTIAL" "$OUT"
[ ! -e "$PARTIAL" ] || { echo "make-big-corpus: '$OUT' appeared meanwhile; left as it is" >&2; exit 1; }
echo " -> $OUT"
