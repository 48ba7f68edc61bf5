#!/usr/bin/env bash
# minimind-eval tokenize --chat against references written apart from it, on a chat corpus with
# tools, tool calls, reasoning, several languages and a conversation longer than a row
# (tests/data/chat-corpus.jsonl), for MiniMind's two tokenizers and their templates:
# - the text: each conversation rendered with Jinja as transformers' apply_chat_template runs
#   MiniMind's chat_template (tests/reference/chat_ref.py, python3-jinja2), which our ids
#   decode back to;
# - the ids: Hugging Face's Rust library (tests/tokenizer) on that text;
# - the labels: MiniMind's rule written again in Python, on whole conversations and on rows
#   cut and padded to 64 ids.
# Usage: chat_exact.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
EVAL="$BUILD/app/minimind-eval"
REF="$SRC/tests/tokenizer"
CORPUS="$SRC/tests/data/chat-corpus.jsonl"
PY=/usr/bin/python3
if ! command -v npm > /dev/null; then
  echo "chat tests skipped: no npm" >&2
  exit 0
fi
npm ci --ignore-scripts --no-audit --no-fund --prefix "$REF" > "$WORK/npm.log" 2>&1 ||
  { cat "$WORK/npm.log" >&2; exit 1; }
fail=0
for dir in "$SRC/tests/data/minimind-tokenizer" "$SRC/tests/data/minimind-tokenizer/minimind2"; do
  name=$(basename "$dir")
  tok="$dir/tokenizer.json"
  "$PY" "$SRC/tests/reference/chat_ref.py" render "$dir/tokenizer_config.json" "$CORPUS" \
    > "$WORK/rendered.jsonl"
  node "$REF/reference_ids.js" "$tok" "$WORK/rendered.jsonl" > "$WORK/ids.txt"
  printf '%s\n' '{"text": "<|im_start|>assistant\n"}' '{"text": "<|im_end|>\n"}' > "$WORK/markers.jsonl"
  node "$REF/reference_ids.js" "$tok" "$WORK/markers.jsonl" > "$WORK/markers.txt"
  open=$(sed -n 1p "$WORK/markers.txt")
  close=$(sed -n 2p "$WORK/markers.txt")
  for len in 0 64; do
    "$PY" "$SRC/tests/reference/chat_ref.py" labels "$WORK/ids.txt" "$open" "$close" "$len" \
      > "$WORK/want.jsonl"
    args=()
    [ "$len" = 0 ] || args=(--max-seq-len "$len")
    "$EVAL" tokenize --tokenizer "$tok" --chat --data "$CORPUS" --json "${args[@]}" \
      > "$WORK/got.jsonl" 2> "$WORK/got.log"
    "$PY" - "$WORK/want.jsonl" "$WORK/got.jsonl" "$name" "$len" <<'PY' || fail=1
import json, sys
want = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
what = f"{sys.argv[3]}, rows of {sys.argv[4] if sys.argv[4] != '0' else 'whole conversations'}"
assert len(want) == len(got), (what, len(want), len(got))
bad_ids = [i for i in range(len(want)) if want[i]["ids"] != got[i]["ids"]]
bad_labels = [i for i in range(len(want)) if want[i]["labels"] != got[i]["labels"]]
ids = sum(len(w["ids"]) for w in want)
trained = sum(sum(1 for x in w["labels"] if x != -100) for w in want)
print(f"{what}: {len(want)} conversations, {ids} ids ({trained} trained); "
      f"{len(bad_ids)} differ in ids, {len(bad_labels)} in labels")
for i in (bad_ids + bad_labels)[:3]:
    print(f"  conversation {i + 1}:\n    want {want[i]}\n    got  {got[i]}")
# Not vacuous: answers are trained, and at 64 ids some row is cut inside an answer.
assert trained > 0
if sys.argv[4] != "0":
    assert any(w["labels"][-1] != -100 for w in want), "no row cut inside an answer"
sys.exit(1 if bad_ids or bad_labels else 0)
PY
  done
  # Our ids decode to Jinja's text, byte for byte.
  "$EVAL" tokenize --tokenizer "$tok" --chat --data "$CORPUS" --json 2> /dev/null |
    "$PY" -c 'import json,sys; [print(" ".join(map(str, json.loads(l)["ids"]))) for l in sys.stdin]' \
      > "$WORK/our-ids.txt"
  "$EVAL" tokenize --tokenizer "$tok" --data "$WORK/our-ids.txt" --decode --json > "$WORK/back.jsonl"
  "$PY" - "$WORK/back.jsonl" "$WORK/rendered.jsonl" "$name" <<'PY' || fail=1
import json, sys
back = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
want = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
bad = [i for i in range(len(want)) if i >= len(back) or back[i] != want[i]]
print(f"{sys.argv[3]}: {len(want) - len(bad)} of {len(want)} renderings equal Jinja's text")
for i in bad[:3]:
    print(f"  conversation {i + 1}:\n    want {want[i]!r}\n    got  {back[i] if i < len(back) else None!r}")
sys.exit(1 if bad else 0)
PY
done
exit "$fail"
